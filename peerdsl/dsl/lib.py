"""Library helpers written in the DSL: reductions with one fixed order, packs, FP8.

Every kernel that reduces a row uses `block_sum` / `block_max`, so the order of a sum of
squares is the same in every kernel and on every target: a butterfly inside each group of
32 lanes (wave32 and wave64 alike), then the group partials added serially in group order.
"""
from __future__ import annotations

from typing import Any, Callable

from . import ir
from .intrinsics import (block_size, fmaximum, lane_id, maximum, minimum, select,
                         shared_array, shfl_xor, thread_id)
from .memory import load_run, shared_barrier
from .values import Scalar, Vector, as_scalar, pack

FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}
FP8_BIAS = {"e4m3fn": 7, "e4m3fnuz": 8}
# the byte torch's conversion gives a NaN (e4m3fn: 0x7F, the sign kept; e4m3fnuz: 0x80, the
# format's only NaN); to_fp8 gives the positive one, whatever the NaN's sign and payload
FP8_NAN = {"e4m3fn": 0x7F, "e4m3fnuz": 0x80}


def _add(a, b):
    return a + b


def group_reduce(x: Any, combine: Callable[[Any, Any], Any]) -> Scalar:
    """Reduce over the 32 lanes of x's group; every lane gets the same bits."""
    for mask in (16, 8, 4, 2, 1):
        x = combine(x, shfl_xor(x, mask))
    return x


def block_reduce(x: Any, combine: Callable[[Any, Any], Any]) -> Scalar:
    """Reduce over the whole block; every thread gets the same bits. Contains shared-memory
    barriers (dsl.shared_barrier): they do not order the block's global accesses."""
    x = as_scalar(x)
    groups = block_size() // 32
    x = group_reduce(x, combine)
    scratch = shared_array("__block_reduce", x.type, 32, reuse=True)
    if lane_id() == 0:
        scratch[thread_id() >> 5] = x
    # only the shared scratch is exchanged: the barriers leave global accesses in flight
    shared_barrier()
    partials = load_run(scratch, groups)
    total = partials[0]
    for p in partials[1:]:
        total = combine(total, p)
    shared_barrier()  # the scratch may be reused by the next reduction
    return total


def block_sum(x: Any) -> Scalar:
    return block_reduce(x, _add)


def block_max(x: Any) -> Scalar:
    """The block's f32 maximum; a NaN on any thread makes it NaN (as torch's amax)."""
    return block_reduce(x, fmaximum)


def pack_rne(values: list[Any], elem: ir.ScalarType) -> Vector:
    """Round f32 values to `elem` (nearest even) and pack them."""
    return pack([as_scalar(v, ir.f32).to(elem) for v in values], elem)


def to_fp8(x: Any, fmt: str, finite: bool = False) -> Scalar:
    """f32 -> one e4m3 byte (as i8), clamped to +-FP8_MAX, round-to-nearest-even; NaN gives
    FP8_NAN[fmt] (torch's `x.clamp(-max, max).to(fp8)` for a positive NaN).

    Done with integer and exact float steps, so it is bit-identical on every target.
    `finite=True`: the caller guarantees x is not NaN, which saves two instructions per value
    (the per-token quant's finite-scale path, where no product can be NaN).
    """
    if fmt not in FP8_MAX:
        raise ValueError(f"fp8 format {fmt!r} is not one of {sorted(FP8_MAX)}")
    x = as_scalar(x, ir.f32)
    byte = _fp8_byte(x, fmt)
    if finite:
        return byte
    return select(x != x, as_scalar(i8_const(FP8_NAN[fmt]), ir.i8), byte)


def i8_const(byte: int) -> int:
    """A byte 0..255 as the signed i8 value that holds it."""
    return byte - 256 if byte > 127 else byte


def _fp8_byte(x: Scalar, fmt: str) -> Scalar:
    fmax, bias = FP8_MAX[fmt], FP8_BIAS[fmt]
    x = maximum(minimum(x, fmax), -fmax)
    bits = x.bitcast(ir.i32)
    sign = (bits >> 31) & 1
    mag = bits & 0x7FFFFFFF
    # normal: round the 23-bit mantissa to 3 bits (carry into the exponent is correct)
    rounded = mag + 0x7FFFF + ((mag >> 20) & 1)
    normal = (rounded >> 20) - ((127 - bias) << 3)
    # subnormal: m = |x| / 2^(1 - bias - 3), rounded to an integer with the 2^23 trick
    scaled = mag.bitcast(ir.f32) * float(2 ** (bias - 1 + 3))
    sub = ((scaled + 8388608.0) - 8388608.0).to_i32()
    min_normal_bits = (127 + 1 - bias) << 23
    code = normal if mag >= min_normal_bits else sub
    if fmt == "e4m3fnuz":
        sign = sign if code != 0 else 0  # fnuz has no negative zero (0x80 is NaN)
    return ((sign << 7) | code).to(ir.i8)

