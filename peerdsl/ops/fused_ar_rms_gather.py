"""Stage 2 of the fused two-stage all-reduce + add + RMSNorm as a launch of its own.

`fused_ar_rms_2stage` with S = 1 reduce-scatters into every rank's staging and ends at its
phase barrier; this kernel, launched next on the same stream, gathers each row from the
owners' staging and runs the add + RMSNorm epilogue (the same helpers and thread mapping, so
the bytes are the fused and unfused paths'). It waits for no peer, so its grid is one block
per row like add_rmsnorm's, where the one-launch kernel's stage 2 has only the collective
grid (one block per SM per rank under MPS), and so few rows' loads in flight.

It reads peers' staging without a barrier of its own: the launch before it closed stage 1
with a barrier on every block, and a failed wait there set this rank's error record, which
`dsl.staged_ok` checks before any row is read. Peers overwrite their staging only after a
later launch's start barrier, which every rank reaches after this kernel on its stream.

Built for NVIDIA targets only, where runtime/dispatch.py `FUSED_2STAGE` may pick S = 1; AMD
targets keep the one-launch kernel.
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, constexpr
from ._collective import WORLDS
from ._rows import (NORM_BLOCK, PACK, PREDICATED_PER_THREAD, RUNTIME_MAXH, SUPPORTED_HIDDEN,
                    RuntimeHidden, norm_block, norm_min_blocks)
from .fused_ar_rms_2stage import gather_norm_rows, shard_sources
from .registry import register


def gather_rows(staging, residual, weight, out, residual_out, q, scale, sig, rank, rows, eps,
                flags, T, H, W, FP8, R):
    sources = shard_sources(staging, H, T, W)
    n = dsl.select(dsl.staged_ok(sig, rank), rows, 0)
    # the residual is read once and residual_out not again until the next layer: streamed,
    # so that the peers' reduced shards, which every rank reads, stay in L2 (out is not:
    # the next kernel reads it)
    gather_norm_rows(staging, dsl.streaming(residual), weight, out,
                     dsl.streaming(residual_out), q, scale, n, eps, flags, T, H, W, FP8, R, 1,
                     sources)


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_gather(staging: PeerPtrs["T"], residual: Ptr["T"], weight: Ptr["T"],
                        out: Ptr["T"], residual_out: Ptr["T"], q: Ptr[dsl.i8],
                        scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                        rows: dsl.i32, eps: dsl.f32, flags: dsl.i32, T: constexpr,
                        H: constexpr, W: constexpr, FP8: constexpr, R: constexpr = 1,
                        M: constexpr = 0, B: constexpr = NORM_BLOCK):
    # R: packs of a row read before any is stored (0: the whole row), per target; M: the
    # blocks per SM it must fit (0: the compiler's choice; _row_slots.norm_min_blocks); B:
    # the threads of a row
    gather_rows(staging, residual, weight, out, residual_out, q, scale, sig, rank, rows, eps,
                flags, T, H, W, FP8, R)


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_gather_runtime_h(staging: PeerPtrs["T"], residual: Ptr["T"],
                                  weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                                  q: Ptr[dsl.i8], scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32],
                                  rank: dsl.i32, rows: dsl.i32, hidden: dsl.i32, eps: dsl.f32,
                                  flags: dsl.i32, T: constexpr, MAXH: constexpr,
                                  W: constexpr, FP8: constexpr, R: constexpr = 1,
                                  M: constexpr = 0, B: constexpr = NORM_BLOCK,
                                  P: constexpr = PREDICATED_PER_THREAD):
    # P: the pack slots a thread may hold for its reads to be predicated, per target
    gather_rows(staging, residual, weight, out, residual_out, q, scale, sig, rank, rows, eps,
                flags, T, RuntimeHidden(hidden, MAXH, P), W, FP8, R)


def variants(target):
    if not getattr(target, "is_nvidia", False):
        return []
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "M": norm_min_blocks(H, norm_block(target, H)), "B": norm_block(target, H)}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in WORLDS
            if (H // PACK) % W == 0]


def runtime_h_variants(target):
    if not getattr(target, "is_nvidia", False):
        return []
    return [{"T": T, "MAXH": M, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "M": norm_min_blocks(M), "B": NORM_BLOCK, "P": target.predicated_row_slots}
            for T in (dsl.bf16, dsl.f16) for M in RUNTIME_MAXH for W in WORLDS]


register("fused_ar_rms_gather", fused_ar_rms_gather, variants)
register("fused_ar_rms_gather_runtime_h", fused_ar_rms_gather_runtime_h, runtime_h_variants)
