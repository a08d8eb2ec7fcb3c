"""Thread geometry, shared memory, lane shuffles and math, as traced ops."""
from __future__ import annotations

from typing import Any

from . import ir
from .builder import TraceError, emit, emit_shared, state, user_location
from .values import Pointer, Scalar, as_scalar


def thread_id() -> Scalar:
    return Scalar(emit("special", [], [ir.i32], which="thread_id").result)


def block_id() -> Scalar:
    return Scalar(emit("special", [], [ir.i32], which="block_id").result)


def num_blocks() -> Scalar:
    return Scalar(emit("special", [], [ir.i32], which="grid_dim").result)


def block_size() -> int:
    """Threads per block: a compile-time constant of the kernel."""
    return state().block_size


def lane_id() -> Scalar:
    """Lane inside a 32-lane group (the unit of shuffles on every target, wave32 or wave64)."""
    return thread_id() & 31


def globaltimer() -> Scalar:
    """A nanosecond clock (for delays and timeouts; not for ordering)."""
    return Scalar(emit("globaltimer", [], [ir.i64]).result)


def schedule_fence() -> None:
    """A boundary the target's instruction scheduler may not move code across. Values and
    memory are unaffected (the simulator ignores it); it bounds how many independent chains
    the scheduler interleaves, and so how many registers are live at once. Lowered where the
    target asks for it (lowering/targets.py `schedule_fences`)."""
    emit("schedule_fence", [], [])


def shared_array(name: str, elem: Any, count: int, reuse: bool = False) -> Pointer:
    """A static shared-memory array; with reuse=True a second call returns the same one."""
    if not isinstance(count, int) or count <= 0:
        raise TraceError(f"{user_location()}: shared array {name!r} needs a positive constant "
                         f"size, got {count!r}")
    return Pointer(emit_shared(name, elem, count, reuse).result)


def shfl_xor(x: Any, mask: int, width: int = 32) -> Scalar:
    """Value of lane (lane ^ mask) inside groups of `width` lanes (width <= 32)."""
    x = as_scalar(x)
    if not (isinstance(mask, int) and 0 < mask < width <= 32):
        raise TraceError(f"{user_location()}: shfl_xor mask {mask!r} must be a constant in "
                         f"(0, {width}) with width <= 32")
    if x.type not in (ir.f32, ir.i32):
        raise TraceError(f"{user_location()}: shfl_xor of {x.type}; shuffle f32 or i32")
    return Scalar(emit("shfl_xor", [x.v], [x.type], mask=mask, width=width).result)


def _unary(name: str, x: Any) -> Scalar:
    x = as_scalar(x)
    if x.type is not ir.f32 and name != "abs":
        raise TraceError(f"{user_location()}: {name} needs f32, got {x.type}")
    return Scalar(emit(name, [x.v], [x.type]).result)


def sqrt(x: Any) -> Scalar:
    """Correctly rounded square root."""
    return _unary("sqrt", x)


def rsqrt(x: Any) -> Scalar:
    """1 / sqrt(x), each step correctly rounded (the same bits on every target and the sim)."""
    return _unary("rsqrt", x)


def rcp(x: Any) -> Scalar:
    """1 / x, correctly rounded."""
    return _unary("rcp", x)


def abs(x: Any) -> Scalar:  # noqa: A001 - the DSL's own abs
    return _unary("abs", x)


def maximum(a: Any, b: Any) -> Scalar:
    """max; for floats the non-NaN operand wins (IEEE maxNum)."""
    from .values import _binary
    return _binary("max", a, b)


def minimum(a: Any, b: Any) -> Scalar:
    from .values import _binary
    return _binary("min", a, b)


def fmaximum(a: Any, b: Any) -> Scalar:
    """f32 max where a NaN operand wins (IEEE 754-2019 maximum, like torch.maximum / amax);
    -0 < +0. One instruction on gfx1250, gfx950 and sm_90 (v_maximum_f32, max.NaN.f32)."""
    from .values import _binary
    a = as_scalar(a, ir.f32)
    if a.type is not ir.f32:
        raise TraceError(f"{user_location()}: fmaximum needs f32 operands, got {a.type}")
    return _binary("fmaximum", a, b)


def fma(a: Any, b: Any, c: Any) -> Scalar:
    """a * b + c with one rounding."""
    a = as_scalar(a)
    b, c = as_scalar(b, a.type), as_scalar(c, a.type)
    if not (a.type == b.type == c.type == ir.f32):
        raise TraceError(f"{user_location()}: fma needs three f32 values")
    return Scalar(emit("fma", [a.v, b.v, c.v], [ir.f32]).result)


def select(cond: Any, a: Any, b: Any) -> Any:
    """Both sides evaluated; no branch."""
    from .control import select as _select
    return _select(cond, lambda: a, lambda: b)
