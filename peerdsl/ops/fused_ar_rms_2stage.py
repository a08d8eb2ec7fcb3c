"""Fused all-reduce + add + RMSNorm, two stages (large rows x hidden, world >= 4).

Stage 1 (reduce-scatter): rank r owns the hidden shard r (H / W columns); block b sums its
rows' shard in rank order from every rank's registered input, rounds to T and writes the
result into rank r's staging. A phase barrier. Stage 2 (gather + epilogue): block b reads
its rows back, each pack from the staging of the rank that owns its shard, and runs the
same epilogue as add + RMSNorm. Block b handles the same rows in both stages, so the
per-block barrier covers everything it reads.

The shards need H / 8 packs divisible by W (dispatch sends other sizes to the one-stage
kernel). `fused_ar_rms_2stage` is specialized for a constexpr H;
`fused_ar_rms_2stage_runtime_h` takes `hidden` at run time up to its constexpr bound MAXH
(the same body and bytes; each thread's shard owners are computed once, before the rows).
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import WORLDS, rank_order_sum
from ._rows import (NORM_BLOCK, PACK, RUNTIME_MAXH, SUPPORTED_HIDDEN, RuntimeHidden,
                    pack_index, read_index, residual_norm_row, row_geometry)
from .registry import register


def shard_source(H, W, k):
    """(owner, offset): the rank whose staging holds this thread's k-th pack of a row, and
    the pack's index in that rank's shard."""
    packs, _ = row_geometry(H)
    shard = packs // W
    p = read_index(H, k)  # (a slot past the row: the clamped pack, where H clamps its reads)
    owner = p // shard
    return owner, p - owner * shard


def gathered_pack(staging, row, H, T, W, k, source=None):
    """This thread's k-th pack of the row, read from the staging of the rank that owns its
    shard (`source`: its shard_source, when computed ahead)."""
    packs, _ = row_geometry(H)
    shard = packs // W
    if source is None:  # (the specialized kernel's code, unchanged)
        p = pack_index(k)
        owner = p // shard
        return staging[owner].cast(dsl.vec16(T))[row * shard + (p - owner * shard)].to_f32()
    owner, offset = source
    return staging[owner].cast(dsl.vec16(T))[row * shard + offset].to_f32()


def two_stage(signal, inp, staging, residual, weight, out, residual_out, q, scale, rank, rows,
              eps, flags, T, H, W, FP8, R=1):
    """The kernel body, given its Signal (tests pass a deliberately broken one)."""
    packs, _ = row_geometry(H)
    shard = packs // W
    P = dsl.vec16(T)
    # A runtime shard size makes each owner a division by a run-time value: done once per
    # slot, before the start barrier, not per row (the specialized kernel divides by a
    # constant, inline).
    sources = [None] * row_geometry(H)[1]
    if isinstance(H, RuntimeHidden):
        sources = [shard_source(H, W, k) for k in range(len(sources))]
    signal.start()
    for row in range(dsl.block_id(), signal.bound(rows), dsl.num_blocks()):
        for j in range(dsl.thread_id(), shard, NORM_BLOCK):
            i = row * packs + rank * shard + j
            acc = rank_order_sum([inp[r].cast(P)[i] for r in range(W)])
            staging[rank].cast(P)[row * shard + j] = dsl.pack_rne(acc, T)
    signal.sync()
    for row in range(dsl.block_id(), signal.bound(rows), dsl.num_blocks()):
        residual_norm_row(lambda k: gathered_pack(staging, row, H, T, W, k, sources[k]), row, H,
                          T, residual, residual_out, weight, eps, flags, out, q, scale, FP8, R)
    signal.end()


@dsl.kernel(block_size=NORM_BLOCK)
def fused_ar_rms_2stage(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"], residual: Ptr["T"],
                        weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                        q: Ptr[dsl.i8], scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32],
                        rank: dsl.i32, rows: dsl.i32, eps: dsl.f32, flags: dsl.i32,
                        call: dsl.CallId, T: constexpr, H: constexpr, W: constexpr,
                        FP8: constexpr, R: constexpr = 1):
    # R: packs of a row read before any is stored (0: the whole row), per target
    two_stage(dsl.Signal(sig, rank, W, call=call), inp, staging, residual, weight, out,
              residual_out, q, scale, rank, rows, eps, flags, T, H, W, FP8, R)


@dsl.kernel(block_size=NORM_BLOCK)
def fused_ar_rms_2stage_runtime_h(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"],
                                  residual: Ptr["T"], weight: Ptr["T"], out: Ptr["T"],
                                  residual_out: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32],
                                  sig: PeerPtrs[dsl.i32], rank: dsl.i32, rows: dsl.i32,
                                  hidden: dsl.i32, eps: dsl.f32, flags: dsl.i32,
                                  call: dsl.CallId, T: constexpr, MAXH: constexpr,
                                  W: constexpr, FP8: constexpr, R: constexpr = 1):
    two_stage(dsl.Signal(sig, rank, W, call=call), inp, staging, residual, weight, out,
              residual_out, q, scale, rank, rows, eps, flags, T, RuntimeHidden(hidden, MAXH), W,
              FP8, R)


def variants(target):
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in WORLDS
            if (H // PACK) % W == 0]


def runtime_h_variants(target):
    return [{"T": T, "MAXH": M, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead}
            for T in (dsl.bf16, dsl.f16) for M in RUNTIME_MAXH for W in WORLDS]


register("fused_ar_rms_2stage", fused_ar_rms_2stage, variants)
register("fused_ar_rms_2stage_runtime_h", fused_ar_rms_2stage_runtime_h, runtime_h_variants)
