"""Memory operations. Every access that another agent may observe names a scope and an order.

A load or store without a scope is a plain (non-atomic) access, free for the compiler to
reorder within the rules of the target memory model. With a scope it is a single-copy-atomic
access at that scope: scalar loads and stores become atomic with the given order; a 16-byte
pack with a scope is a relaxed access of one instruction at that scope, volatile inside a
`while` (a poll) (targets have no atomic vector accesses; the LL protocol relies only on
the 16 bytes landing together, which every target gives for an aligned 16-byte access).

A store through a peer pointer (`Pointer.peer`: a peer-table entry indexed with anything but
this rank's own rank) must name a scope: a plain store into another rank's memory is refused
at trace time. Plain loads through one stay allowed (the collectives read peers' inputs after
the Signal's acquire). Atomics always name a scope.
"""
from __future__ import annotations

from typing import Any

from . import ir
from .builder import TraceError, emit, user_location
from .values import Pointer, Scalar, Traced, Vector, as_scalar, wrap

_LOAD_ORDERS = ("relaxed", "acquire")
_STORE_ORDERS = ("relaxed", "release")
_ATOMIC_KINDS = ("add", "max", "umax", "xchg")


def _check(p: Any, scope: str | None, order: str | None, allowed: tuple[str, ...], what: str):
    if not isinstance(p, Pointer):
        raise TraceError(f"{user_location()}: {what} needs a pointer, got {p!r}")
    if scope is None:
        if order is not None:
            raise TraceError(f"{user_location()}: {what} with order={order!r} must name a scope "
                             f"(one of {ir.SCOPES})")
        return None, None
    if scope not in ir.SCOPES:
        raise TraceError(f"{user_location()}: scope {scope!r} is not one of {ir.SCOPES}")
    order = order or "relaxed"
    if order not in allowed:
        raise TraceError(f"{user_location()}: order {order!r} is not valid for {what}; "
                         f"use one of {allowed}")
    if p.type.space == "shared" and scope in ("agent", "system"):
        raise TraceError(f"{user_location()}: shared memory is only visible to the workgroup; "
                         f"scope {scope!r} is meaningless there")
    if isinstance(p.elem, ir.VectorType) and order != "relaxed":
        raise TraceError(f"{user_location()}: a {p.elem} access cannot be {order}; publish packs "
                         "with a relaxed scoped store and a release on a flag or fence")
    return scope, order


def load(p: Pointer, scope: str | None = None, order: str | None = None,
         nontemporal: bool = False) -> Traced:
    scope, order = _check(p, scope, order, _LOAD_ORDERS, "load")
    attrs = {"scope": scope, "order": order, "nontemporal": bool(nontemporal)}
    return wrap(emit("load", [p.v], [p.elem], **attrs).result)


def _needs_scope(scope: str | None, what: str) -> None:
    if scope is None:
        raise TraceError(f"{user_location()}: {what} needs a scope (one of {ir.SCOPES}) and an "
                         "order")


def load_run(p: Pointer, n: int) -> list[Scalar]:
    """p[0], ..., p[n - 1] (plain loads; p 16-byte aligned) in as few reads as the alignment
    allows: 16 bytes at a time, then 8, then single elements. One wide read each, whether
    or not the target's compiler would merge scalar reads (lowering/targets.py
    auto_vectorize)."""
    out: list[Scalar] = []
    size = p.elem.nbytes
    for width in (16, 8):
        per = width // size
        if per < 2:
            continue
        vec = p.cast(ir.VectorType(p.elem, per))
        while n - len(out) >= per:
            out += vec[len(out) // per].elements()
    return out + [load(p + i) for i in range(len(out), n)]


def store(p: Pointer, value: Any, scope: str | None = None, order: str | None = None,
          nontemporal: bool = False) -> None:
    scope, order = _check(p, scope, order, _STORE_ORDERS, "store")
    if scope is None and p.peer:
        raise TraceError(
            f"{user_location()}: plain store through a peer pointer (a peer-table entry not "
            "indexed with this rank's `rank`: possibly another rank's memory). Name a scope and "
            "an order, e.g. dsl.store(p, v, \"system\", \"relaxed\"), and publish it with a "
            "release (a Signal barrier); for this rank's own buffer index the table with the "
            "kernel's `rank` parameter")
    if isinstance(p.elem, ir.VectorType):
        if not isinstance(value, Vector) or value.type != p.elem:
            raise TraceError(f"{user_location()}: storing {getattr(value, 'type', value)!r} "
                             f"through a {p.type}")
    else:
        value = as_scalar(value, p.elem)
        if value.type != p.elem:
            raise TraceError(f"{user_location()}: storing {value.type} through a {p.type}; "
                             "convert explicitly")
    emit("store", [p.v, value.v], [], scope=scope, order=order, nontemporal=bool(nontemporal))


def atomic(kind: str, p: Pointer, value: Any, scope: str, order: str = "relaxed") -> Scalar:
    if kind not in _ATOMIC_KINDS:
        raise TraceError(f"{user_location()}: atomic kind {kind!r} is not one of {_ATOMIC_KINDS}")
    _needs_scope(scope, f"atomic {kind}")
    scope, order = _check(p, scope, order, ir.ORDERS, f"atomic {kind}")
    if p.elem not in (ir.i32, ir.i64) and not (kind == "add" and p.elem is ir.f32):
        raise TraceError(f"{user_location()}: atomic {kind} on {p.elem} is not supported")
    value = as_scalar(value, p.elem)
    return Scalar(emit("atomic", [p.v, value.v], [p.elem], kind=kind, scope=scope,
                       order=order).result)


def atomic_add(p, v, scope, order="relaxed"): return atomic("add", p, v, scope, order)
def atomic_max(p, v, scope, order="relaxed"): return atomic("max", p, v, scope, order)
def atomic_xchg(p, v, scope, order="relaxed"): return atomic("xchg", p, v, scope, order)


def atomic_cas(p: Pointer, expected: Any, desired: Any, scope: str,
               order: str = "acq_rel") -> Scalar:
    _needs_scope(scope, "compare-swap")
    scope, order = _check(p, scope, order, ir.ORDERS, "compare-swap")
    if p.elem not in (ir.i32, ir.i64):
        raise TraceError(f"{user_location()}: compare-swap on {p.elem} is not supported")
    e, d = as_scalar(expected, p.elem), as_scalar(desired, p.elem)
    return Scalar(emit("cas", [p.v, e.v, d.v], [p.elem], scope=scope, order=order).result)


def fence(scope: str, order: str = "acq_rel") -> None:
    if scope not in ir.SCOPES:
        raise TraceError(f"{user_location()}: scope {scope!r} is not one of {ir.SCOPES}")
    if order not in ("acquire", "release", "acq_rel"):
        raise TraceError(f"{user_location()}: fence order {order!r} must be acquire, release "
                         "or acq_rel")
    emit("fence", [], [], scope=scope, order=order)


def barrier() -> None:
    """Block-wide barrier: every thread arrives, and workgroup memory is made visible."""
    emit("barrier", [], [])


def shared_barrier() -> None:
    """Block-wide barrier that orders shared memory only: every thread arrives, and what the
    block wrote to shared memory before it is visible after it. Global loads and stores are
    NOT ordered by it (they may still be in flight), so on gfx1250 it waits on LDS alone
    instead of on every outstanding global access. Use barrier() when threads of the block
    communicate through global memory or before a Signal release."""
    emit("barrier", [], [], memory="shared")
