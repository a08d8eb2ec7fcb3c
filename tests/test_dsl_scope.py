"""A plain (unscoped) store into possibly another rank's memory is refused at trace time;
this rank's own memory (a peer table indexed with the kernel's `rank`, or a Signal's rank)
stays a plain access; atomics always name a scope. Every shipped op still traces."""
from __future__ import annotations

import inspect

import pytest

import peerdsl.dsl as dsl
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, TraceError, constexpr


def line_of(kernel, marker: str) -> str:
    """This file's path and the line of `kernel` whose text contains `marker`."""
    lines, first = inspect.getsourcelines(kernel.fn)
    n = next(i for i, text in enumerate(lines) if marker in text)
    return f"{__file__}:{first + n}"


@dsl.kernel(block_size=64)
def store_to_peer(buf: PeerPtrs[dsl.i32], rank: dsl.i32, HOW: constexpr):
    t = dsl.thread_id()
    peer = (rank + 1) % 2
    if HOW == "constant":
        buf[1][t] = 7  # MARK constant
    if HOW == "traced":
        dsl.store(buf[peer] + t, 7)  # MARK traced
    if HOW == "arith":
        dsl.store((buf[1] + 4).cast(dsl.i32x4), dsl.pack([1, 2, 3, 4], dsl.i32))  # MARK arith
    if HOW == "scoped":
        dsl.store(buf[peer] + t, 7, "system", "relaxed")
        buf[rank][t] = buf[peer][t]  # own memory: plain; a plain peer load stays allowed
    if HOW == "own":
        dsl.store(buf[rank] + t, 7)


@dsl.kernel(block_size=64)
def store_to_registered(inp: RegisteredPtrs[dsl.f32], rank: dsl.i32, HOW: constexpr):
    t = dsl.thread_id()
    if HOW == "constant":
        inp[0][t] = 1.0  # MARK constant
    if HOW == "traced":
        inp[t % 2][t] = 1.0  # MARK traced
    if HOW == "own":
        inp[rank][t] = inp[0][t] + inp[t % 2][t]


@pytest.mark.parametrize("how", ["constant", "traced", "arith"])
def test_plain_store_to_a_peer_is_refused(how):
    with pytest.raises(TraceError) as e:
        store_to_peer.trace(HOW=how)
    msg = str(e.value)
    assert line_of(store_to_peer, f"MARK {how}") in msg
    assert "plain store through a peer pointer" in msg and "scope" in msg and "`rank`" in msg


@pytest.mark.parametrize("how", ["constant", "traced"])
def test_plain_store_to_a_registered_peer_is_refused(how):
    with pytest.raises(TraceError) as e:
        store_to_registered.trace(HOW=how)
    assert line_of(store_to_registered, f"MARK {how}") in str(e.value)


def _stores(k):
    return [op.attrs["scope"] for op in k.walk() if op.name == "store"]


def test_scoped_and_own_rank_stores_trace():
    assert _stores(store_to_peer.trace(HOW="scoped")) == ["system", None]
    assert _stores(store_to_peer.trace(HOW="own")) == [None]
    assert _stores(store_to_registered.trace(HOW="own")) == [None]


@dsl.kernel(block_size=64)
def signal_with_another_rank_name(sig: PeerPtrs[dsl.i32], stage: PeerPtrs[dsl.f32],
                                  me: dsl.i32, W: constexpr):
    s = dsl.Signal(sig, me, W)  # the Signal's own plain epoch load/store are own memory
    stage[me][dsl.thread_id()] = 1.0  # its rank is this rank's: a plain store is fine
    s.start()
    s.end()


def test_a_signal_declares_its_rank_as_own():
    k = signal_with_another_rank_name.trace(W=2)
    plain = [op for op in k.walk() if op.name in ("load", "store") and op.attrs["scope"] is None]
    assert len(plain) >= 3  # stage[me] store, the epoch load, the epoch store in finish()


@dsl.kernel(block_size=32)
def unscoped_atomic(p: Ptr[dsl.i32], KIND: constexpr):
    if KIND == "add":
        dsl.atomic_add(p, 1, None)  # MARK add
    else:
        dsl.atomic_cas(p, 0, 1, None)  # MARK cas


@pytest.mark.parametrize("kind", ["add", "cas"])
def test_an_atomic_needs_a_scope(kind):
    with pytest.raises(TraceError) as e:
        unscoped_atomic.trace(KIND=kind)
    assert line_of(unscoped_atomic, f"MARK {kind}") in str(e.value)
    assert "needs a scope" in str(e.value)


def test_every_shipped_op_traces():
    """Each registered variant of every op for every target, hidden sizes cut to the
    smallest of each op (H only changes how far the row loops unroll); tests/test_build_all.py
    --long builds every variant."""
    from peerdsl.lowering.targets import TARGETS
    from peerdsl.ops.registry import load_all
    traced = 0
    for name, spec in sorted(load_all().items()):
        for t in TARGETS.values():
            variants = spec.variants(t)
            h_min = min((v["H"] for v in variants if "H" in v), default=None)
            for cx in variants:
                if cx.get("H", h_min) == h_min:
                    k = spec.kernel.trace(**cx)
                    assert k.body.ops, (name, cx)
                    traced += 1
    assert traced > 100
