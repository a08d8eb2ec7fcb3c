"""One size change per call over 1000 calls, every rank started a different number of steps
late at every launch: every call must be exact (the agreement checks never fire on calls the
ranks agree on, and grid and size changes never let a stale line or slot through). Mostly LL
sizes (one block up to four), with a one-stage all-reduce or a fused call every 25th call.
`--long` runs it at TP4 as well."""
from __future__ import annotations

import random

import pytest

from fault_harness import Step, run_case, statuses

CALLS = 1000


def plan(seed: int, calls: int) -> list[Step]:
    rng = random.Random(seed)
    steps, last = [], None
    for i in range(calls):
        if i % 25 == 24:
            step = rng.choice([Step("ar", 8 * rng.randrange(1025, 2048)),
                               Step("fused", rng.randrange(2, 6))])
        else:
            step = Step("ar", 8 * rng.randrange(1, 513))
        if step == last:   # one change per call
            step = Step("ar", step.n + 8) if step.kind == "ar" else Step("fused", step.n + 1)
        steps.append(step)
        last = step
    return steps


@pytest.mark.parametrize("tp", [2, 4])
def test_a_size_change_per_call_with_skew(tp, long_run):
    if tp == 4 and not long_run:
        pytest.skip("TP4 soak: run with --long")
    steps = plan(tp, CALLS)
    assert all(a != b for a, b in zip(steps, steps[1:]))
    rng = random.Random(tp)
    delays = [[rng.randrange(0, 500) for _ in range(tp)] for _ in range(257)]
    res = run_case(f"{CALLS} calls, a size change per call, skew (TP{tp})", tp, steps,
                   skew=lambda i: delays[i % len(delays)])
    assert statuses(res) == [["exact"] * CALLS] * tp
