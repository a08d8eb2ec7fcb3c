"""Closures for the pure (register-only) ops of the IR: arithmetic, compares, casts, vectors,
shuffles and pointer arithmetic. Each returns `f(regs)`; see `numerics.py` for the register
representation and the exact rounding of each op.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ...dsl import ir
from ..errors import SimError
from . import numerics as nx

_F32_ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
              "rem": np.fmod, "min": np.fmin, "max": np.fmax,
              "fmaximum": nx.fmaximum}
_INT_ARITH = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": nx.int_div,
              "rem": nx.int_rem, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and,
              "or": np.bitwise_or, "xor": np.bitwise_xor}
_BOOL_ARITH = {"add": np.bitwise_xor, "sub": np.bitwise_xor, "mul": np.bitwise_and,
               "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
               "min": np.bitwise_and, "max": np.bitwise_or}
_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal,
        # wrap-safe counter compares: the sign of the wrapping difference (numpy integer
        # arrays wrap like the targets' two's complement subtract)
        "wlt": lambda a, b: (a - b) < 0, "wge": lambda a, b: (a - b) >= 0}
_F32_ONE = np.float32(1.0)


def _unary(fn: Callable, a: int, o: int):
    def f(r):
        r[o] = fn(r[a])
    return f


def _binary(fn: Callable, a: int, b: int, o: int):
    def f(r):
        r[o] = fn(r[a], r[b])
    return f


def _via_f32(fn: Callable, t: ir.ScalarType) -> Callable:
    """An f32 op applied to f16/bf16 operands (exact: min/max/compares only)."""
    def g(*xs):
        res = fn(*[nx.to_f32(x, t) for x in xs])
        return res if res.dtype == np.bool_ else nx.from_f32(res, t)
    return g


def compile_pure(op: ir.Op, ins: list[int], outs: list[int], lanes: int) -> Callable:
    name, a = op.name, op.attrs
    o = outs[0] if outs else -1
    t = op.operands[0].type if op.operands else None
    if name in ("add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor",
                "shl", "shr", "fmaximum"):
        if name == "shl":
            return _binary(lambda x, y: nx.shl(x, y, t), ins[0], ins[1], o)
        if name == "shr":
            return _binary(lambda x, y: nx.shr_logical(x, y, t), ins[0], ins[1], o)
        if t.name == "i1":
            return _binary(_BOOL_ARITH[name], ins[0], ins[1], o)
        if t.is_float:
            fn = _F32_ARITH[name]
            return _binary(fn if t.name == "f32" else _via_f32(fn, t), ins[0], ins[1], o)
        return _binary(_INT_ARITH[name], ins[0], ins[1], o)
    if name == "cmp":
        fn = _CMP[a["pred"]]
        if a["pred"] in ("wlt", "wge") and not (t.is_int and t.name != "i1"):
            raise SimError(f"{a['pred']} compares integer counters, not {t} (at {op.loc})")
        if t.name in ("bf16",):
            fn = _via_f32(fn, t)
        return _binary(fn, ins[0], ins[1], o)
    if name == "select":
        c, x, y = ins

        def f_select(r):
            cv, xv = r[c], r[x]
            r[o] = np.where(cv if xv.ndim == 1 else cv[:, None], xv, r[y])
        return f_select
    if name == "fma":
        x, y, z = ins

        def f_fma(r):
            r[o] = nx.fma_f32(r[x], r[y], r[z])
        return f_fma
    if name == "neg":
        if t.name == "bf16":
            return _unary(lambda v: v ^ np.uint16(0x8000), ins[0], o)
        return _unary(np.negative, ins[0], o)
    if name == "not":
        return _unary(np.invert, ins[0], o)
    if name == "abs":
        if t.name == "bf16":
            return _unary(lambda v: v & np.uint16(0x7FFF), ins[0], o)
        return _unary(np.abs, ins[0], o)
    if name == "sqrt":
        return _unary(np.sqrt, ins[0], o)
    if name == "rsqrt":  # two roundings, as the IR says
        return _unary(lambda v: _F32_ONE / np.sqrt(v), ins[0], o)
    if name == "rcp":
        return _unary(lambda v: _F32_ONE / v, ins[0], o)
    if name == "cast":
        return _unary(_cast_fn(a["kind"], t, op.result.type, a), ins[0], o)
    if name == "fp8_to_f32":
        fmt = a["fmt"]
        return _unary(lambda v: nx.fp8_to_f32(v, fmt), ins[0], o)
    if name == "vec_extract":
        i, src = a["index"], ins[0]

        def f_extract(r):
            r[o] = r[src][:, i]
        return f_extract
    if name == "vec_build":
        def f_build(r):
            r[o] = np.stack([r[s] for s in ins], axis=1)
        return f_build
    if name == "shfl_xor":
        perm = np.arange(lanes) ^ a["mask"]  # mask < width: stays inside the group
        src = ins[0]

        def f_shfl(r):
            r[o] = r[src][perm]
        return f_shfl
    if name == "ptr_offset":
        size = op.operands[0].type.elem.nbytes
        p, idx = ins

        def f_offset(r):
            r[o] = r[p] + r[idx].astype(np.int64) * size
        return f_offset
    if name in ("ptr_cast", "int_to_ptr"):  # simulator pointers are int64 addresses
        src = ins[0]

        def f_cast(r):
            r[o] = r[src]
        return f_cast
    if name == "ptr_select":
        idx, table = ins[0], ins[1:]
        n = len(table)

        def f_ptr_select(r):
            # an index outside the table gives a null pointer: an access through it faults
            # (lanes that never access it, e.g. inactive ones, may hold any index)
            i = r[idx]
            i0 = int(i[0])
            if (i == i0).all():
                r[o] = r[table[i0]] if 0 <= i0 < n else np.zeros(len(i), np.int64)
            else:
                res = np.choose(np.clip(i, 0, n - 1), [r[s] for s in table])
                r[o] = np.where((i >= 0) & (i < n), res, 0)
        return f_ptr_select
    raise SimError(f"the simulator does not know IR op {name!r} (at {op.loc})")


def _cast_fn(kind: str, src, dst, attrs) -> Callable:
    if kind == "bitcast":
        if isinstance(src, ir.VectorType):
            ddt, cnt = nx.np_dtype(dst), dst.count
            return lambda v: np.ascontiguousarray(v).view(ddt).reshape(len(v), cnt)
        ddt = nx.np_dtype(dst)
        return lambda v: v.view(ddt)
    if kind in ("sext", "trunc"):
        ddt = nx.np_dtype(dst)
        return lambda v: v.astype(ddt)  # numpy int casts wrap: two's complement truncation
    if kind == "zext":
        return lambda v: nx.zext(v, src, dst)
    if kind == "sitofp":
        return lambda v: nx.from_f32(v.astype(np.float32), dst)  # int -> f32 is RNE
    if kind == "fptosi":
        ddt = nx.np_dtype(dst)
        return lambda v: nx.to_f32(v, src).astype(ddt)  # C cast: truncates toward zero
    if kind == "extf":
        return lambda v: nx.from_f32(nx.to_f32(v, src), dst)
    if kind == "truncf":
        return lambda v: nx.from_f32(nx.to_f32(v, src), dst)
    if kind == "fp8":
        fmt = attrs["fmt"]
        return lambda v: fp8_encode(v, fmt)
    raise SimError(f"unknown cast kind {kind!r}")


def fp8_encode(x: np.ndarray, fmt: str) -> np.ndarray:
    """f32 -> e4m3 byte (as int8): clamp to +-max (NaN -> +max, maxNum), then RNE."""
    fmax = np.float32(nx.FP8_MAX[fmt])
    bias = 7 if fmt == "e4m3fn" else 8
    x = np.fmax(np.fmin(x.astype(np.float32), fmax), -fmax)
    bits = x.view(np.int32)
    sign = (bits >> 31) & 1
    mag = bits & 0x7FFFFFFF
    normal = ((mag + 0x7FFFF + ((mag >> 20) & 1)) >> 20) - ((127 - bias) << 3)
    scaled = mag.view(np.float32) * np.float32(2.0 ** (bias - 1 + 3))
    sub = ((scaled + np.float32(8388608.0)) - np.float32(8388608.0)).astype(np.int32)
    code = np.where(mag >= ((127 + 1 - bias) << 23), normal, sub)
    if fmt == "e4m3fnuz":
        sign = np.where(code != 0, sign, 0)
    return ((sign << 7) | code).astype(np.int8)
