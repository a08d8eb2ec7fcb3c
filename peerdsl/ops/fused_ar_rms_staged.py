"""Fused all-reduce + add + RMSNorm with one barrier: the one-stage fused kernel's rows and
epilogue (ops/fused_ar_rms_1stage.py, the same bytes), reading every rank's rows from its
staging half instead of its registered input, with no end barrier.

Block b copies its rows (b, b + G, ...) of this rank's input into this rank's half, crosses
the start barrier (a release: the copy is visible), then reads those rows from every rank's
half. The half is the launch epoch's parity, and a half is written again only after a launch
in between has waited for every peer, as ops/allreduce_staged.py explains: so no rank
overwrites what a peer still reads, and the next launch's start barrier does what the end
barrier did. The input is read in place: nothing is registered.

sm_90 only, the specialized hidden sizes, W < 8 (runtime/dispatch.py
`fused_staged_max_bytes`; AMD targets build none, their kernels stay the gfx1250 PR's). V rows
per block iteration as in `fused_ar_rms_1stage_rows`, where that kernel is built.
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from ._rows import (NORM_BLOCK, SUPPORTED_HIDDEN, pack_index, pack_valid,
                    residual_norm_block_rows, row_geometry)
from .allreduce_ll import advance_ll_epoch, next_ll_epoch
from .fused_ar_rms_1stage import reduced_pack, rows_in_flight
from .registry import register

WORLDS = (2, 4)  # W = 8 spilled in the one-stage fused kernel at 8192 (RESULTS.md)


class _Half:
    """Every rank's half as the one-stage kernel's `inp` table: rank r's pointer starts at
    the half's first pack."""

    def __init__(self, halves, base, T):
        self.halves, self.base, self.P = halves, base, dsl.vec16(T)

    def __getitem__(self, r):
        return self.halves[r].cast(self.P) + self.base


def stage_rows(x, mine, rows, H, T) -> None:
    """This block's rows of x into `mine` (this rank's half, as packs): each thread the
    packs of the row it reads later (the block barrier before the start barrier's release
    covers the others' anyway)."""
    packs, per_thread = row_geometry(H)
    src = x.cast(dsl.vec16(T))
    for row in range(dsl.block_id(), rows, dsl.num_blocks()):
        for k in range(per_thread):
            if pack_valid(H, k):
                i = row * packs + pack_index(k)
                mine[i] = src[i]


@dsl.kernel(block_size=NORM_BLOCK)
def fused_ar_rms_staged(x: Ptr["T"], halves: PeerPtrs["T"], residual: Ptr["T"],
                        weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                        q: Ptr[dsl.i8], scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32],
                        rank: dsl.i32, rows: dsl.i32, half_packs: dsl.i32, eps: dsl.f32,
                        flags: dsl.i32, call: dsl.CallId, T: constexpr, H: constexpr,
                        W: constexpr, FP8: constexpr, R: constexpr = 1, V: constexpr = 1):
    # half_packs: the packs one half holds (rows * H / 8 <= half_packs: the host checks)
    me = sig[rank]
    epoch = next_ll_epoch(dsl.load(me + (layout.SIG_LL_EPOCH + dsl.block_id())))
    half = _Half(halves, (epoch & 1) * half_packs, T)
    signal = dsl.Signal(sig, rank, W, call=call)
    stage_rows(x, half[rank], rows, H, T)
    signal.start()
    residual_norm_block_rows(lambda r, k: reduced_pack(half, r, H, T, W, k), signal.bound(rows),
                             V, H, T, residual, residual_out, weight, eps, flags, out, q, scale,
                             FP8, R)
    signal.finish()
    advance_ll_epoch(me, epoch)


def variants(target):
    if not getattr(target, "is_nvidia", False):
        return []
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "V": V}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in WORLDS
            for V in (1, *rows_in_flight(H, W))]


register("fused_ar_rms_staged", fused_ar_rms_staged, variants)
