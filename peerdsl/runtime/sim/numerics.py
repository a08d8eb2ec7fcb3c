"""Bit-exact scalar semantics of the kernel IR over numpy lane arrays (see `dsl/ir.py`).

Register representation (one numpy array per SSA value, first axis = lanes):
  i1 bool, i8 int8, i32 int32, i64 int64, f32 float32, f16 float16,
  bf16 uint16 holding the raw bits (numpy has no bfloat16; every bf16 op goes through f32),
  pointers int64 addresses, vectors [lanes, count] of the element representation.
"""
from __future__ import annotations

import numpy as np

from ...dsl import ir

NP_DTYPE = {"i1": np.dtype(np.bool_), "i8": np.dtype(np.int8), "i32": np.dtype(np.int32),
            "i64": np.dtype(np.int64), "f16": np.dtype(np.float16),
            "bf16": np.dtype(np.uint16), "f32": np.dtype(np.float32)}
UNSIGNED = {1: np.uint8, 8: np.uint8, 32: np.uint32, 64: np.uint64}


def np_dtype(t) -> np.dtype:
    """numpy dtype of a register of IR type t (vector: of its element)."""
    if isinstance(t, ir.PtrType):
        return np.dtype(np.int64)
    if isinstance(t, ir.VectorType):
        return NP_DTYPE[t.elem.name]
    return NP_DTYPE[t.name]


def const_array(value, t, lanes: int) -> np.ndarray:
    """A read-only register of `lanes` copies of a constant of scalar type t."""
    if t.name == "bf16":
        arr = np.full(lanes, f32_to_bf16(np.array([value], np.float32))[0], np.uint16)
    elif t.is_int and t.name != "i1":
        # two's complement: constants may be given unsigned (e.g. 0xFFFFFFFF for i32)
        v = int(value) & ((1 << t.bits) - 1)
        if v >= 1 << (t.bits - 1):
            v -= 1 << t.bits
        arr = np.full(lanes, v, NP_DTYPE[t.name])
    else:
        arr = np.full(lanes, value, NP_DTYPE[t.name])
    arr.flags.writeable = False  # registers are never mutated in place; catch it if one is
    return arr


# ----------------------------------------------------------------------------- floats

def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even on the f32 bits; NaN stays a (quiet) NaN."""
    b = np.ascontiguousarray(x, np.float32).view(np.uint32)
    rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, (b >> np.uint32(16)) | np.uint32(0x40), rounded)
    return rounded.astype(np.uint16)


def to_f32(x: np.ndarray, t: ir.ScalarType) -> np.ndarray:
    if t.name == "bf16":
        return bf16_to_f32(x)
    return x.astype(np.float32)


def from_f32(x: np.ndarray, t: ir.ScalarType) -> np.ndarray:
    if t.name == "bf16":
        return f32_to_bf16(x)
    return x.astype(NP_DTYPE[t.name])  # f16: numpy's float->half conversion is RNE


def fma_f32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a*b+c rounded once to f32: exact product in f64, the sum rounded to odd in f64
    (TwoSum gives the exact error), then one rounding to f32 (53 >= 2*24+2 bits)."""
    p = a.astype(np.float64) * b.astype(np.float64)  # exact: 48-bit product
    c64 = c.astype(np.float64)
    s = p + c64
    bp = s - c64
    err = (p - bp) + (c64 - (s - bp))
    fix = (err != 0) & np.isfinite(s) & ((s.view(np.int64) & 1) == 0)
    if fix.any():
        s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def fmaximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE 754-2019 maximum of f32 arrays: NaN if either is NaN (the quiet NaN 0x7FC00000:
    the payload is unspecified on hardware), and +0 above -0."""
    r = np.maximum(a, b)
    zeros = (a == 0) & (b == 0)
    if zeros.any():  # -0 only when both are -0: the AND of the sign bits
        bits = a.view(np.uint32) & b.view(np.uint32)
        r = np.where(zeros, bits.view(np.float32), r)
    nan = np.isnan(r)
    if nan.any():
        r = np.where(nan, np.float32(np.nan), r)
    return r.astype(np.float32, copy=False)


# ----------------------------------------------------------------------------- integers

def _safe_divisor(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """x/0 and MIN/-1 are UB in LLVM; the sim and the lowering both divide by 1 instead
    (x/0 -> 0 after the select below, MIN/-1 -> MIN, and both remainders 0)."""
    mn = np.iinfo(a.dtype).min
    return np.where((b == 0) | ((a == mn) & (b == -1)), 1, b).astype(a.dtype)


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Signed division truncating toward zero (C); x/0 gives 0, MIN/-1 gives MIN."""
    zero = b == 0
    bs = _safe_divisor(a, b)
    q = a // bs  # floor
    adjust = (q * bs != a) & ((a < 0) != (bs < 0))
    q = np.where(adjust, q + 1, q).astype(a.dtype)
    return np.where(zero, 0, q).astype(a.dtype)


def int_rem(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C remainder: the sign of the dividend; x%0 and MIN%-1 give 0."""
    bs = _safe_divisor(a, b)
    return (a - int_div(a, bs) * bs).astype(a.dtype)


def shift_mask(t: ir.ScalarType) -> int:
    return max(t.bits, 8) - 1


def shr_logical(a: np.ndarray, s: np.ndarray, t: ir.ScalarType) -> np.ndarray:
    ut = UNSIGNED[t.bits]
    if t.name == "i1":
        return a & (s == 0)
    sh = (s & shift_mask(t)).astype(ut)
    return (a.view(ut) >> sh).view(a.dtype)


def shl(a: np.ndarray, s: np.ndarray, t: ir.ScalarType) -> np.ndarray:
    if t.name == "i1":
        return a & (s == 0)
    ut = UNSIGNED[t.bits]
    sh = (s & shift_mask(t)).astype(ut)
    return (a.view(ut) << sh).view(a.dtype)


def zext(a: np.ndarray, src: ir.ScalarType, dst: ir.ScalarType) -> np.ndarray:
    if src.name == "i1":
        return a.astype(NP_DTYPE[dst.name])
    return a.view(UNSIGNED[src.bits]).astype(NP_DTYPE[dst.name])


# ----------------------------------------------------------------------------- fp8

FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}


def _fp8_table(fmt: str) -> np.ndarray:
    """f32 value of each of the 256 e4m3 codes (NaN codes included)."""
    bias = 7 if fmt == "e4m3fn" else 8
    out = np.empty(256, np.float32)
    for code in range(256):
        s, e, m = code >> 7, (code >> 3) & 15, code & 7
        if e == 0:
            v = m * 2.0 ** (1 - bias - 3)
        else:
            v = (1 + m / 8) * 2.0 ** (e - bias)
        if fmt == "e4m3fn" and e == 15 and m == 7:
            v = float("nan")
        if fmt == "e4m3fnuz" and code == 0x80:
            v, s = float("nan"), 0
        out[code] = -v if s else v
    return out


FP8_TABLES = {fmt: _fp8_table(fmt) for fmt in FP8_MAX}


def fp8_to_f32(codes: np.ndarray, fmt: str) -> np.ndarray:
    return FP8_TABLES[fmt][codes.view(np.uint8)]
