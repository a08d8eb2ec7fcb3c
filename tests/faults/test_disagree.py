"""Issue 14 item 3: ranks that disagree on the call (rows, dtype, hidden size, path, all-gather
size) at the same point. Every barrier arrival and LL line carries the call's tag (op, dtype,
shapes, kernel, world and sequence number), so each rank sees the other side's call at the
same epoch and raises CollectiveMismatch naming both; a block whose barrier failed reads no
peer memory (`Signal.bound`), so nothing faults. Two kernels that share no protocol (a Signal
barrier against LL lines) cannot see each other's tag: both spins expire (CollectiveTimeout)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fault_harness import Step, first_errors, run_case, statuses

FUSED = Step("fused", 4)
BROKEN_AFTER = ["CommunicatorBroken"]


def _disagree(case, tp, step, other, rank=1, before=2):
    steps = [FUSED] * before + [step, FUSED]
    return run_case(case, tp, steps, {(rank, before): other})


@pytest.mark.parametrize("case,step,other", [
    ("fused rows 64 vs 32", Step("fused", 64), Step("fused", 32)),
    ("all_reduce rows 64 vs 32", Step("ar", 64 * 2880), Step("ar", 32 * 2880)),
    ("LL all_reduce 4 KiB vs 2 KiB", Step("ar", 2048), Step("ar", 1024)),
    ("fused bf16 vs fp16", FUSED, dataclasses.replace(FUSED, dtype=torch.float16)),
    ("fused hidden 2880 vs 4096", FUSED, dataclasses.replace(FUSED, hidden=4096)),
    ("all_gather 512 vs 256", Step("ag", 512), Step("ag", 256)),
    ("fused_1stage vs fused_2stage", Step("fused", 4, path="fused_1stage"),
     Step("fused", 4, path="fused_2stage")),
])
def test_ranks_that_disagree_raise_mismatch(case, step, other):
    tp = 4 if "2stage" in case else 2
    res = _disagree(f"{case} (TP{tp})", tp, step, other)
    assert first_errors(res) == ["CollectiveMismatch"] * tp, statuses(res)
    assert all(s == ["exact", "exact", "CollectiveMismatch"] + BROKEN_AFTER
               for s in statuses(res))


def test_one_rank_of_four_disagrees():
    res = _disagree("fused_2stage rows 3 vs 2 on one rank of four", 4,
                    Step("fused", 3, path="fused_2stage"), Step("fused", 2, path="fused_2stage"),
                    rank=2, before=1)
    assert statuses(res) == [["exact", "CollectiveMismatch"] + BROKEN_AFTER] * 4


def test_paths_without_a_shared_protocol_time_out():
    """Rank 0 forced to the one-stage fused kernel (Signal barriers), rank 1 to LL + add +
    RMSNorm (LL lines): neither sees the other's tag, both spins expire within the limit."""
    res = _disagree("fused_1stage vs ll+rmsnorm (TP2)", 2, Step("fused", 1, path="fused_1stage"),
                    Step("fused", 1, path="ll+rmsnorm"))
    assert first_errors(res) == ["CollectiveTimeout"] * 2, statuses(res)
