"""Fused all-reduce + add + RMSNorm (+ FP8 per-token, + T mirror), one stage.

Between a start and an end barrier, block b takes rows b, b + G, ...; each thread reads its
packs of the row directly from every rank's registered input, sums them in rank order,
rounds to T (the all-reduce result the unfused path would hold), then runs the same epilogue
as the add + RMSNorm kernel with the same thread mapping, so the bytes are identical.

`fused_ar_rms_1stage` is specialized for a constexpr H; `fused_ar_rms_1stage_runtime_h`
takes `hidden` at run time up to its constexpr bound MAXH (the same body and bytes).
`fused_ar_rms_1stage_rows` is the specialized kernel taking V rows per iteration (rows b,
b + G, ..., b + (V-1) G), every pack of all V read before the first store, for where rows
outnumber the blocks: a block's rows are then in flight together instead of one after the
other (same bytes). sm_90 only (runtime/dispatch.py `fused_1stage_rows`); AMD targets build
none, so their kernels stay the ones the gfx1250 PR measured.
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import WORLDS, rank_order_sum
from ._rows import (NORM_BLOCK, PREDICATED_PER_THREAD, RUNTIME_MAXH, SUPPORTED_HIDDEN,
                    RuntimeHidden, collective_min_blocks, norm_block,
                    one_stage_predicated_slots, pack_index, residual_norm_block_rows,
                    row_geometry, slot_pack)
from .registry import register


def reduced_pack(inp, row, H, T, W, k):
    """This thread's k-th pack of the row, read from every rank, summed in rank order and
    rounded to T (as f32); +0 past the row where H predicates its reads (slot_pack)."""
    packs, _ = row_geometry(H)
    P = dsl.vec16(T)
    i = row * packs + pack_index(k)
    acc = rank_order_sum([slot_pack(inp[r].cast(P), i, H, k) for r in range(W)])
    return [a.to(T).to_f32() for a in acc]


def one_stage(signal, inp, residual, weight, out, residual_out, q, scale, rows, eps, flags,
              T, H, W, FP8, R=1, V=1):
    signal.start()
    residual_norm_block_rows(lambda r, k: reduced_pack(inp, r, H, T, W, k), signal.bound(rows),
                             V, H, T, residual, residual_out, weight, eps, flags, out, q, scale,
                             FP8, R)
    signal.end()


# The V (rows per iteration) `fused_ar_rms_1stage_rows` builds for (H, W) on sm_90: those
# whose V x W x (packs per thread) 16-byte loads in flight fit its 128 registers without
# spilling, bf16 and f16 (2026-12-04 build). V = 2: 7168 spilled 16 bytes at W = 2 and 4 (its
# last slot is partial), 8192 4 bytes at W = 4 in f16. V = 4 at 2880 (two slots per thread,
# one partial) fits, 111-120 registers; at 4096 and 6144 it spilled 4-272 bytes. W = 8 is not
# tried (it cannot be measured on the one lent GPU).
ROWS_FIT: dict[tuple[int, int], tuple[int, ...]] = {
    (2880, 2): (2, 4), (2880, 4): (2, 4), (4096, 2): (2,), (4096, 4): (2,), (6144, 2): (2,),
    (6144, 4): (2,), (8192, 2): (2,)}


def rows_in_flight(H: int, W: int) -> tuple[int, ...]:
    """The V > 1 `fused_ar_rms_1stage_rows` is built with for H and W (() for none)."""
    return ROWS_FIT.get((H, W), ())


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_1stage(inp: RegisteredPtrs["T"], residual: Ptr["T"], weight: Ptr["T"], out: Ptr["T"],
                        residual_out: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32],
                        sig: PeerPtrs[dsl.i32], rank: dsl.i32, rows: dsl.i32, eps: dsl.f32,
                        flags: dsl.i32, call: dsl.CallId, T: constexpr, H: constexpr,
                        W: constexpr, FP8: constexpr, R: constexpr = 1,
                        B: constexpr = NORM_BLOCK, M: constexpr = 0):
    # R: packs of a row read before any is stored (0: the whole row), per target; B: the
    # threads of a row (_row_slots.norm_block); M: the blocks per SM it must fit
    # (_row_slots.collective_min_blocks)
    one_stage(dsl.Signal(sig, rank, W, call=call), inp, residual, weight, out, residual_out, q,
              scale, rows, eps, flags, T, H, W, FP8, R)


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_1stage_runtime_h(inp: RegisteredPtrs["T"], residual: Ptr["T"],
                                  weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                                  q: Ptr[dsl.i8], scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32],
                                  rank: dsl.i32, rows: dsl.i32, hidden: dsl.i32, eps: dsl.f32,
                                  flags: dsl.i32, call: dsl.CallId, T: constexpr,
                                  MAXH: constexpr, W: constexpr, FP8: constexpr,
                                  R: constexpr = 1, B: constexpr = NORM_BLOCK,
                                  M: constexpr = 0, P: constexpr = PREDICATED_PER_THREAD):
    # P: the pack slots a thread may hold for its reads to be predicated (per target, W)
    one_stage(dsl.Signal(sig, rank, W, call=call), inp, residual, weight, out, residual_out, q,
              scale, rows, eps, flags, T, RuntimeHidden(hidden, MAXH, P), W, FP8, R)


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_1stage_rows(inp: RegisteredPtrs["T"], residual: Ptr["T"], weight: Ptr["T"],
                             out: Ptr["T"], residual_out: Ptr["T"], q: Ptr[dsl.i8],
                             scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                             rows: dsl.i32, eps: dsl.f32, flags: dsl.i32, call: dsl.CallId,
                             T: constexpr, H: constexpr, W: constexpr, FP8: constexpr,
                             V: constexpr, B: constexpr = NORM_BLOCK, M: constexpr = 0):
    one_stage(dsl.Signal(sig, rank, W, call=call), inp, residual, weight, out, residual_out, q,
              scale, rows, eps, flags, T, H, W, FP8, V=V)


def _mapping(target, H):
    B = norm_block(target, H)
    return {"B": B, "M": collective_min_blocks(B)}


def variants(target):
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             **_mapping(target, H)}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in WORLDS]


def runtime_h_variants(target):
    return [{"T": T, "MAXH": M, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "B": NORM_BLOCK, "P": one_stage_predicated_slots(target, W)}
            for T in (dsl.bf16, dsl.f16) for M in RUNTIME_MAXH for W in WORLDS]


def rows_variants(target):
    if not getattr(target, "is_nvidia", False):
        return []
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "V": V, **_mapping(target, H)}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in WORLDS
            for V in rows_in_flight(H, W)]


register("fused_ar_rms_1stage", fused_ar_rms_1stage, variants)
register("fused_ar_rms_1stage_rows", fused_ar_rms_1stage_rows, rows_variants)
register("fused_ar_rms_1stage_runtime_h", fused_ar_rms_1stage_runtime_h, runtime_h_variants)
