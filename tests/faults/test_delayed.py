"""A rank delayed past the spin limit, and a rank whose error record was already set when
its kernel started (what a graph replay after an unseen failure looks like: no host check
runs between replays). The rank that waited raises CollectiveTimeout; a late rank either
gets everything it needs (the LL lines were pushed before the other rank gave up: exact) or
meets the abort mark at a later barrier (CollectiveAborted); nobody consumes what a rank that
gave up wrote."""
from __future__ import annotations

import numpy as np
import pytest

from fault_harness import Step, first_errors, run_case, statuses
from peerdsl import layout

LATE = 400_000   # scheduler steps: far past a spin limit of 3000 polls

CASES = [("LL all_reduce", 2, Step("ar", 1024)), ("one-stage all_reduce", 2, Step("ar", 8192)),
         ("fused_1stage", 2, Step("fused", 4)),
         ("two-stage all_reduce", 4, Step("ar", 8192)),
         ("fused_2stage", 4, Step("fused", 3, path="fused_2stage"))]


def _late(rank: int, index: int):
    def before(comm, i):
        comm.delay = LATE if (comm.rank, i) == (rank, index) else 0
    return before


@pytest.mark.parametrize("case,tp,step", CASES)
def test_a_rank_delayed_past_the_spin_limit(case, tp, step):
    late = tp - 1
    res = run_case(f"rank {late} delayed past the spin limit ({case}, TP{tp})", tp,
                   [step] * 4, before=_late(late, 1))
    st, first = statuses(res), first_errors(res)
    assert all(s[0] == "exact" for s in st)
    assert all(f == "CollectiveTimeout" for r, f in enumerate(first) if r != late), st
    if case.startswith("LL"):   # its peers' lines were all there: the late rank is exact
        assert st[late][1] == "exact"
    else:                       # their next arrival carried the abort mark
        assert st[late][1] == "CollectiveAborted", st
    assert all(s[-1] in ("CommunicatorBroken", "SimPeerGone") for s in st), st


def _record_set(rank: int, index: int):
    def before(comm, i):
        if (comm.rank, i) == (rank, index):
            with comm.job.system.lock:
                comm.device.write(comm.signal.address + 4 * layout.SIG_ERROR, np.array([1], np.int32))
    return before


@pytest.mark.parametrize("case,tp,step", CASES)
def test_peers_of_a_rank_whose_record_is_set_raise(case, tp, step):
    res = run_case(f"rank 0 starts with its error record set ({case}, TP{tp})", tp,
                   [step] * 3, before=_record_set(0, 1))
    first = first_errors(res)
    assert first[0] == "CollectiveTimeout" and first[1:] == ["CollectiveAborted"] * (tp - 1), \
        statuses(res)
