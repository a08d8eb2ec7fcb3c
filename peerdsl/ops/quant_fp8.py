"""Per-token FP8 quantization (SPEC 2.4): the standalone kernel; the fused epilogue calls the
same helper (`quant_row_fp8`). `per_token_quant_fp8` is specialized for a constexpr H;
`per_token_quant_fp8_runtime_h` takes `hidden` at run time up to MAXH (same bytes)."""
from .. import dsl
from ..dsl import Ptr, constexpr
from ._rows import (NORM_BLOCK, PREDICATED_PER_THREAD, RUNTIME_MAXH, SUPPORTED_HIDDEN,
                    RuntimeHidden, load_row_packs, norm_block, quant_row_fp8)
from .registry import register


def quant_rows(x, q, scale, rows, T, H, FP8):
    for row in range(dsl.block_id(), rows, dsl.num_blocks()):
        quant_row_fp8(load_row_packs(x, row, H, T), row, H, q, scale, FP8)


@dsl.kernel(block_size="B")
def per_token_quant_fp8(x: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32], rows: dsl.i32,
                        T: constexpr, H: constexpr, FP8: constexpr, B: constexpr = NORM_BLOCK):
    quant_rows(x, q, scale, rows, T, H, FP8)


@dsl.kernel(block_size="B")
def per_token_quant_fp8_runtime_h(x: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32],
                                  rows: dsl.i32, hidden: dsl.i32, T: constexpr,
                                  MAXH: constexpr, FP8: constexpr, B: constexpr = NORM_BLOCK,
                                  P: constexpr = PREDICATED_PER_THREAD):
    # P: the pack slots a thread may hold for its reads to be predicated, per target
    quant_rows(x, q, scale, rows, T, RuntimeHidden(hidden, MAXH, P), FP8)


def variants(target):
    return [{"T": T, "H": H, "FP8": target.fp8_format, "B": norm_block(target, H)}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN]


def runtime_h_variants(target):
    return [{"T": T, "MAXH": M, "FP8": target.fp8_format, "B": NORM_BLOCK,
             "P": target.predicated_row_slots}
            for T in (dsl.bf16, dsl.f16) for M in RUNTIME_MAXH]


register("per_token_quant_fp8", per_token_quant_fp8, variants)
register("per_token_quant_fp8_runtime_h", per_token_quant_fp8_runtime_h, runtime_h_variants)
