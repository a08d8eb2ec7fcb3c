"""A rank that launches a kernel twice (its host, or one rank's graph, replays a launch the
others do not): the duplicate carries the same call's tag while its peers are at their next
call, so both sides raise CollectiveMismatch. The same launch repeated on every rank (what a
graph replay is: the captured tags repeat, the device epochs advance) is no mismatch: every
replay is exact."""
from __future__ import annotations

import pytest

from fault_harness import Step, first_errors, run_case, statuses

PLANS = [("LL", 2, [Step("ar", 1024), Step("ar", 1024), Step("ar", 512), Step("ar", 1024)]),
         ("fused_1stage", 2, [Step("fused", 4)] * 4),
         ("fused_2stage", 4, [Step("fused", 2, path="fused_2stage")] * 4)]


def _twice_at(n: int):
    count = [0]

    def hook(comm, launch, name, constexprs, grid, args):
        count[0] += 1
        launch(dict(args))
        if count[0] == n:
            launch(dict(args))   # the duplicate, same call id
    return hook


@pytest.mark.parametrize("case,tp,steps", PLANS)
def test_a_rank_that_launches_twice(case, tp, steps):
    res = run_case(f"rank 0 launches call 1 twice ({case}, TP{tp})", tp, steps,
                   hooks={0: _twice_at(2)})
    st = statuses(res)
    assert st[0][:2] == ["exact", "CollectiveMismatch"], st
    assert all(s[1] == "exact" and s[2] == "CollectiveMismatch" for s in st[1:]), st
    assert first_errors(res) == ["CollectiveMismatch"] * tp


@pytest.mark.parametrize("case,tp,steps", PLANS)
def test_every_rank_replaying_every_launch_is_exact(case, tp, steps):
    def replay(comm, launch, name, constexprs, grid, args):
        for _ in range(3):
            launch(dict(args))
    res = run_case(f"every launch replayed 3 times on every rank ({case}, TP{tp})", tp, steps,
                   hooks={r: replay for r in range(tp)})
    assert statuses(res) == [["exact"] * len(steps)] * tp
