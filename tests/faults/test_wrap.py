"""Issue 14 items 2 and 4: epochs compared wrap-safely everywhere, and 0 never a valid LL
flag. A test hook starts a communicator's epochs (every block epoch, every barrier slot, the
LL epoch) just below 2^31 and 2^32; the calls then cross the wrap with every rank started a
different number of steps late each launch, and every result must be exact.

With the signed compare put back (the old `sge`), the two-stage kernels' phase barrier that
lands on 2^31 passes at once on the stale slot and ranks read unstaged shards; with a plain
unsigned compare the same happens at 2^32. With the LL epoch allowed to wrap to 0, the zeroed
lines of the scratch match it."""
from __future__ import annotations

import random

import numpy as np
import pytest

from fault_harness import Step, run_case, statuses
from peerdsl import dsl, layout
from peerdsl.ops.allreduce_ll import next_ll_epoch

TWO_STAGE_MIX = [Step("ar", 8192), Step("fused", 3, path="fused_2stage"), Step("null"),
                 Step("ar", 12288), Step("fused", 2, path="fused_2stage"), Step("ag", 512),
                 Step("ar", 8192)]


def _skew(seed: int, world: int):
    rng = random.Random(seed)
    delays = [[rng.randrange(0, 600) for _ in range(world)] for _ in range(64)]
    return lambda i: delays[i % len(delays)]


@pytest.mark.parametrize("start", [2**31 - 2, 2**31 - 5, 2**32 - 2, 2**32 - 5])
def test_signal_epochs_cross_the_wrap(start):
    """k = 2 and 5 put the first or second call's phase barrier (two-stage) on the wrap."""
    res = run_case(f"Signal epochs from {start:#x} (TP4)", 4, TWO_STAGE_MIX,
                   setup=lambda comm: comm.set_epochs_for_test(start),
                   skew=_skew(start, 4))
    assert statuses(res) == [["exact"] * len(TWO_STAGE_MIX)] * 4


@pytest.mark.parametrize("start", [2**31 - 2, 2**32 - 3])
def test_one_stage_and_ll_cross_the_wrap(start):
    steps = [Step("ar", n) for n in (512, 1024, 2048, 4096)] + \
        [Step("fused", 4), Step("fused", 5), Step("null"), Step("ar", 8192)]
    res = run_case(f"LL and one-stage epochs from {start:#x} (TP2)", 2, steps,
                   setup=lambda comm: comm.set_epochs_for_test(start), skew=_skew(start, 2))
    assert statuses(res) == [["exact"] * len(steps)] * 2


def test_ll_epoch_skips_zero_and_keeps_alternating_banks():
    """The LL epoch stored after each launch, from 2^32 - 3: the LL sizes grow across the
    wrap, so the launch that would have used epoch 0 reads lines its peers never wrote
    (zeroed scratch) unless 0 is skipped."""
    seen: dict[int, list[int]] = {0: [], 1: []}

    def before(comm, i):
        copies = comm.device.read(comm.signal.address + 4 * layout.SIG_LL_EPOCH,
                                  4 * layout.MAX_BLOCKS).view(np.uint32)
        assert len(set(copies.tolist())) == 1, "the LL epoch's copies differ"
        seen[comm.rank].append(int(copies[0]))
    steps = [Step("ar", n) for n in (256, 512, 1024, 2048, 4096)]
    res = run_case("LL epoch from 0xfffffffd (TP2)", 2, steps, before=before,
                   setup=lambda comm: comm.set_epochs_for_test(2**32 - 3),
                   skew=lambda i: [0, 400])
    assert statuses(res) == [["exact"] * 5] * 2
    want = [2**32 - 3, 2**32 - 2, 2**32 - 1, 2, 3]     # 0 (and 1) skipped: parity alternates
    assert seen == {0: want, 1: want}
    assert [e & 1 for e in want[1:]] == [0, 1, 0, 1]


@dsl.kernel(block_size=32)
def _compare(a: dsl.Ptr[dsl.i32], b: dsl.Ptr[dsl.i32], out: dsl.Ptr[dsl.i32]):
    t = dsl.thread_id()
    out[t] = dsl.wge(a[t], b[t]).zext(dsl.i32) * 2 + dsl.wlt(a[t], b[t]).zext(dsl.i32)


def test_wrap_safe_compares_in_the_simulator_and_the_lowering():
    import torch
    from sim_kernels import run1
    from peerdsl.lowering.mlir_gen import generate
    pairs = [(1, 0), (0, 1), (2**31, 2**31 - 1), (2**31 - 1, 2**31), (0, 2**32 - 1),
             (2**32 - 1, 0), (5, 5), (2**31 + 7, 7), (3, 2**31 + 3)] * 4
    a = torch.tensor([p[0] for p in pairs[:32]], dtype=torch.int64).to(torch.int32)
    b = torch.tensor([p[1] for p in pairs[:32]], dtype=torch.int64).to(torch.int32)
    got = run1(_compare.trace(), {}, {"a": a, "b": b}, {"out": ((32,), torch.int32)})["out"]
    diff = [((int(x) - int(y)) & 0xFFFFFFFF) for x, y in zip(a, b)]
    want = [2 if d < 2**31 else 1 for d in diff]
    assert got.tolist() == want
    text, _ = generate(_compare.trace(), "gfx1250")
    assert text.count("arith.subi") == 2 and "arith.cmpi sge" in text and \
        "arith.cmpi slt" in text
