"""Row helpers shared by every kernel that normalizes or quantizes a row (SPEC section 2).

The fused kernels and the unfused add + RMSNorm kernel must produce the same bytes, so they
share these helpers *and* the thread mapping: thread t of a block of NORM_BLOCK threads
owns the 16-byte packs t, t + BLOCK, t + 2 BLOCK, ... of the row, and every sum of squares
goes through dsl.block_sum in that order.
"""
from __future__ import annotations

from typing import Any

from .. import dsl

PACK = 8             # elements of a 16-byte bf16/f16 pack
FLAG_GEMMA = 1       # runtime flags of the norm kernels
FLAG_FP8 = 2
FLAG_MIRROR = 4
SUPPORTED_HIDDEN = (2880, 4096, 6144, 7168, 8192)
NORM_BLOCK = 256


def row_geometry(H: int) -> tuple[int, int]:
    """(packs per row, packs per thread)."""
    packs = H // PACK
    return packs, (packs + NORM_BLOCK - 1) // NORM_BLOCK


def pack_valid(H: int, k: int) -> Any:
    """Whether this thread's k-th pack lies inside the row (a Python True when always)."""
    packs, _ = row_geometry(H)
    if packs % NORM_BLOCK == 0:
        return True
    return dsl.thread_id() + k * NORM_BLOCK < packs


def pack_index(k: int) -> Any:
    return dsl.thread_id() + k * NORM_BLOCK


def load_row_packs(base: Any, row: Any, H: int, T: Any) -> list:
    """This thread's packs of row `row` as f32 lists (zeros past the end of the row)."""
    packs, per_thread = row_geometry(H)
    vec = base.cast(dsl.vec16(T))
    out = []
    for k in range(per_thread):
        vals = [0.0] * PACK
        if pack_valid(H, k):
            vals = vec[row * packs + pack_index(k)].to_f32()
        out.append(vals)
    return out


def store_row_packs(base: Any, row: Any, H: int, T: Any, values: list) -> None:
    packs, per_thread = row_geometry(H)
    vec = base.cast(dsl.vec16(T))
    for k in range(per_thread):
        if pack_valid(H, k):
            vec[row * packs + pack_index(k)] = dsl.pack_rne(values[k], T)


def round_to(values: list, T: Any) -> list:
    """values rounded to T and back to f32 (what a T tensor would hold)."""
    return [[v.to(T).to_f32() if isinstance(v, dsl.Scalar) else float(v) for v in pack]
            for pack in values]


def quant_row_fp8(out_f32: list, row: Any, H: int, q: Any, scale: Any, fmt: str) -> None:
    """Per-token FP8 of one row (SPEC 2.4); out_f32 holds f32 of the T-rounded outputs.

    The standalone quant kernel and the fused epilogue both call this.
    """
    packs, per_thread = row_geometry(H)
    amax = 0.0
    for k in range(per_thread):
        for v in out_f32[k]:
            amax = dsl.maximum(amax, dsl.abs(v))
    amax = dsl.block_max(amax)
    s = amax * (1.0 / dsl.FP8_MAX[fmt])  # constant in double, rounded once to f32
    inv = 0.0 if s == 0.0 else dsl.rcp(s)
    qvec = q.cast(dsl.i8x8)
    for k in range(per_thread):
        if pack_valid(H, k):
            # A zero output is the +0 byte: SPEC's all-zero-row rule, applied per element so
            # neither -0 nor 0 * inf (a subnormal scale has an infinite reciprocal) leaks out.
            qvec[row * packs + pack_index(k)] = dsl.pack(
                [0 if v == 0.0 else dsl.to_fp8(v * inv, fmt) for v in out_f32[k]], dsl.i8)
    if dsl.thread_id() == 0:
        scale[row] = s


def rmsnorm_epilogue(s: list, row: Any, H: int, T: Any, weight: Any, eps: Any, flags: Any,
                     out: Any, q: Any, scale: Any, fmt: str) -> None:
    """Given s = f32(ar) + f32(residual) for this thread's packs, write out (and FP8)."""
    packs, per_thread = row_geometry(H)
    # the weight load is issued before the reduction's barriers, so its latency overlaps them
    w = load_row_packs(weight, 0, H, T)
    acc = 0.0
    for k in range(per_thread):
        for v in s[k]:
            acc = acc + v * v
    total = dsl.block_sum(acc)
    inv = dsl.rsqrt(total / float(H) + eps)
    gemma = (flags & FLAG_GEMMA) != 0
    normed = []
    for k in range(per_thread):
        vals = []
        for j in range(PACK):
            wj = dsl.select(gemma, w[k][j] + 1.0, w[k][j])
            vals.append((s[k][j] * inv) * wj)
        normed.append(vals)
    fp8 = (flags & FLAG_FP8) != 0
    if (not fp8) or ((flags & FLAG_MIRROR) != 0):
        store_row_packs(out, row, H, T, normed)
    if fp8:
        quant_row_fp8(round_to(normed, T), row, H, q, scale, fmt)


def residual_norm_row(ar: list, row: Any, H: int, T: Any, residual: Any, residual_out: Any,
                      weight: Any, eps: Any, flags: Any, out: Any, q: Any, scale: Any,
                      fmt: str) -> None:
    """Given this thread's all-reduced packs of a row (f32 of T values): add the residual,
    write residual_out, and run the RMSNorm epilogue. Every norm kernel ends a row here."""
    res = load_row_packs(residual, row, H, T)
    s = [[a + b for a, b in zip(pa, pr)] for pa, pr in zip(ar, res)]
    store_row_packs(residual_out, row, H, T, s)
    rmsnorm_epilogue(s, row, H, T, weight, eps, flags, out, q, scale, fmt)
