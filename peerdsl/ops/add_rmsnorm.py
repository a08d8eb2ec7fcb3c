"""Add + RMSNorm (+ per-token FP8): the unfused path's second kernel, and the world == 1 path.

One block per row (grid-stride over rows). SPEC 2.2: s = f32(x) + f32(residual),
residual_out = T(s), out = T((s * rsqrt(mean(s^2) + eps)) * w).

Two kernels, one body: `add_rmsnorm` is specialized for a constexpr H (the common sizes,
SUPPORTED_HIDDEN); `add_rmsnorm_runtime_h` takes `hidden` at run time, up to its constexpr
bound MAXH (ops/_row_slots.py RuntimeHidden), and gives the same bytes at the same H.
"""
from .. import dsl
from ..dsl import Ptr, constexpr
from ._rows import (NORM_BLOCK, PREDICATED_PER_THREAD, RUNTIME_MAXH, SUPPORTED_HIDDEN,
                    RuntimeHidden, norm_block, norm_min_blocks, residual_norm_row,
                    row_pack_reader)
from .registry import register


def norm_rows(x, residual, weight, out, residual_out, q, scale, rows, eps, flags, T, H, FP8,
              R=1):
    for row in range(dsl.block_id(), rows, dsl.num_blocks()):
        residual_norm_row(row_pack_reader(x, row, H, T), row, H, T, residual, residual_out,
                          weight, eps, flags, out, q, scale, FP8, R)


@dsl.kernel(block_size="B", min_blocks="M")
def add_rmsnorm(x: Ptr["T"], residual: Ptr["T"], weight: Ptr["T"], out: Ptr["T"],
                residual_out: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32], rows: dsl.i32,
                eps: dsl.f32, flags: dsl.i32, T: constexpr, H: constexpr, FP8: constexpr,
                R: constexpr = 1, M: constexpr = 0, B: constexpr = NORM_BLOCK):
    # R: packs of a row read before any is stored (0: the whole row), per target; M: the
    # blocks per SM it must fit (_row_slots.norm_min_blocks); B: the threads of a row
    norm_rows(x, residual, weight, out, residual_out, q, scale, rows, eps, flags, T, H, FP8, R)


@dsl.kernel(block_size="B", min_blocks="M")
def add_rmsnorm_runtime_h(x: Ptr["T"], residual: Ptr["T"], weight: Ptr["T"], out: Ptr["T"],
                          residual_out: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32],
                          rows: dsl.i32, hidden: dsl.i32, eps: dsl.f32, flags: dsl.i32,
                          T: constexpr, MAXH: constexpr, FP8: constexpr, R: constexpr = 1,
                          M: constexpr = 0, B: constexpr = NORM_BLOCK,
                          P: constexpr = PREDICATED_PER_THREAD):
    # P: the pack slots a thread may hold for its reads to be predicated, per target
    norm_rows(x, residual, weight, out, residual_out, q, scale, rows, eps, flags, T,
              RuntimeHidden(hidden, MAXH, P), FP8, R)


def variants(target):
    return [{"T": T, "H": H, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "M": norm_min_blocks(H, norm_block(target, H)), "B": norm_block(target, H)}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN]


def runtime_h_variants(target):
    return [{"T": T, "MAXH": M, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "M": norm_min_blocks(M), "B": NORM_BLOCK, "P": target.predicated_row_slots}
            for T in (dsl.bf16, dsl.f16) for M in RUNTIME_MAXH]


register("add_rmsnorm", add_rmsnorm, variants)
register("add_rmsnorm_runtime_h", add_rmsnorm_runtime_h, runtime_h_variants)
