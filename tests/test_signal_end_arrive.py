"""Signal.end_arrive(): the end barrier's arrival alone, then end() waits. What may sit between
them is refused at trace time; the end arrival (the kernel's one release) goes out before the
block's own stores placed between them, and the wait after those stores."""
from __future__ import annotations

import pytest

import peerdsl.dsl as dsl
from peerdsl.dsl import PeerPtrs, Ptr, TraceError, constexpr


@dsl.kernel(block_size=64)
def early_end(sig: PeerPtrs[dsl.i32], out: Ptr[dsl.f32], me: dsl.i32, n: dsl.i32,
              BETWEEN: constexpr):
    s = dsl.Signal(sig, me, 2)
    s.start()
    m = s.bound(n)
    s.end_arrive()
    if BETWEEN == "bound":
        s.bound(n)
    if BETWEEN == "barrier":
        s.start()
    if BETWEEN == "finish":
        s.finish()
        return
    if BETWEEN == "inside_if":
        if dsl.thread_id() < m:
            s.end()
        return
    out[dsl.thread_id()] = 1.0  # the block's own stores may sit between
    s.end()


@pytest.mark.parametrize("between,msg", [
    ("bound", "between end_arrive\\(\\) and end\\(\\)"),
    ("barrier", "must be followed by end\\(\\)"),
    ("finish", "end_arrive\\(\\) without end\\(\\)"),
    ("inside_if", "end\\(\\) inside a traced if"),
])
def test_what_may_not_sit_between_end_arrive_and_end(between, msg):
    with pytest.raises(TraceError, match=msg):
        early_end.trace(BETWEEN=between)


def test_the_release_goes_out_before_the_blocks_stores_and_the_wait_after_them():
    ops = list(early_end.trace(BETWEEN="stores").walk())
    at = {i: op for i, op in enumerate(ops)}

    def where(pred):
        return [i for i, op in at.items() if pred(op)]

    slot = "ptr<i64,global>"  # a barrier slot: (tag << 32) | epoch
    releases = where(lambda op: op.name == "store" and op.attrs["order"] == "release")
    waits = where(lambda op: op.name == "load" and op.attrs["order"] == "acquire"
                  and str(op.operands[0].type) == slot)
    output = where(lambda op: op.name == "store" and op.attrs["scope"] is None
                   and str(op.operands[0].type) == "ptr<f32,global>")
    assert len(releases) == 1 and len(output) == 1  # the end arrival; out[t] = 1.0
    assert str(at[releases[0]].operands[0].type) == slot
    assert releases[0] < output[0] < min(w for w in waits if w > releases[0])
    assert [w for w in waits if w > output[0]]  # end() still waits for the peers
