"""Trace state: where the next op goes, and which user source line it came from."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator

from . import ir

_DSL_DIR = os.path.dirname(os.path.abspath(__file__))


class TraceError(Exception):
    """A kernel cannot be traced; the message names the user's source line."""


class _State:
    def __init__(self) -> None:
        self.blocks: list[ir.Block] = []
        self.shared: list[ir.Op] = []
        self.block_size: int = 0
        self.constexprs: dict[str, Any] = {}
        self.signals: list[Any] = []  # Signals made by the kernel: each must be finished
        self.entry_ops = 0  # ops spliced at the top of the kernel body (emit_at_entry)
        self.own_ranks: set[int] = set()  # ids of values holding this rank (values.is_own_rank)
        self.writes = 0  # stores and atomics traced so far (Signal.start: what to release)


_state: _State | None = None


def user_location(skip_dsl: bool = True) -> str:
    """file:line of the innermost frame outside peerdsl/dsl (the kernel author's code)."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (skip_dsl and os.path.dirname(os.path.abspath(filename)) == _DSL_DIR):
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


def state() -> _State:
    if _state is None:
        raise TraceError(f"DSL operation used outside a kernel trace at {user_location()}")
    return _state


@contextlib.contextmanager
def tracing(block_size: int, constexprs: dict[str, Any]) -> Iterator[_State]:
    global _state
    if _state is not None:
        raise TraceError("nested kernel traces are not supported; call helpers, not kernels")
    _state = _State()
    _state.block_size = block_size
    _state.constexprs = dict(constexprs)
    try:
        yield _state
    finally:
        _state = None


def is_tracing() -> bool:
    return _state is not None


@contextlib.contextmanager
def in_block(block: ir.Block) -> Iterator[ir.Block]:
    st = state()
    st.blocks.append(block)
    try:
        yield block
    finally:
        st.blocks.pop()


_WRITES = ("store", "atomic", "cas")


def emit(name: str, operands: list[ir.Value], result_types: list[Any], **attrs: Any) -> ir.Op:
    st = state()
    op = ir.Op(name, list(operands), [], attrs, loc=user_location())
    if name in _WRITES:
        st.writes += 1
    op.results = [ir.Value(t, op) for t in result_types]
    st.blocks[-1].ops.append(op)
    return op


def emit_at_entry(build: Any) -> Any:
    """Run `build()` with its ops placed at the top of the kernel body, whatever control flow
    the trace is in, so the values it makes dominate every later use."""
    st = state()
    scratch = ir.Block()
    st.blocks.append(scratch)
    try:
        result = build()
    finally:
        st.blocks.pop()
    body = st.blocks[0]
    body.ops[st.entry_ops:st.entry_ops] = scratch.ops
    st.entry_ops += len(scratch.ops)
    return result


def emit_shared(name: str, elem: Any, count: int, reuse: bool = False) -> ir.Op:
    st = state()
    for op in st.shared:
        if op.attrs["name"] == name:
            if reuse and op.attrs["count"] == count and op.result.type.elem == elem:
                return op
            raise TraceError(f"shared allocation {name!r} declared twice at {user_location()}")
    op = ir.Op("smem", [], [], {"name": name, "count": count}, loc=user_location())
    op.results = [ir.Value(ir.PtrType(elem, "shared"), op)]
    st.shared.append(op)
    return op
