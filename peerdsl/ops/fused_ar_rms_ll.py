"""Fused LL all-reduce + add + RMSNorm (+ FP8 per-token, + T mirror): SPEC section 5's
`ll+rmsnorm` path in one launch, with no barrier.

Block b takes rows b, b + G, ...; thread t owns the packs of each row that the add + RMSNorm
kernel gives it (ops/_row_slots.py). First it pushes every pack it owns, as the LL all-reduce
does (ops/allreduce_ll.py: the same lines, banks, epoch and tags, in every rank's scratch);
then, row by row, it waits for every rank's lines of its packs, sums them in rank order and
rounds to T (the bytes the LL all-reduce stores), and runs the add + RMSNorm epilogue
(ops/_rows.py) on them. So out, residual_out and the FP8 bytes equal those of the LL
all-reduce followed by add_rmsnorm, and the input is read in place. A row's packs are pushed
by the same block that collects them on every rank, since every rank launches the same grid.

Built for NVIDIA targets only (runtime/built.py FUSED_LL_OP; the fused entry launches it for
`ll+rmsnorm` where it is built for H and W): AMD targets keep the two launches the gfx1250
PR measured.
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from ._rows import (NORM_BLOCK, SUPPORTED_HIDDEN, collective_min_blocks, norm_block,
                    pack_index, pack_valid, residual_norm_block_rows, row_geometry)
from .allreduce_ll import (advance_ll_epoch, ll_first_reads, ll_half_lines, ll_half_sum,
                           ll_push_pack, ll_regions, next_ll_epoch)
from .registry import register


def ll_reduced_pack(regions, row, k, H, T, epoch, tag, limit, me, rank):
    """This thread's k-th pack of the row: every rank's lines, summed in rank order and
    rounded to T (as f32), as the LL all-reduce stores them. Both halves' lines are read
    before either is waited for: one round trip a pack where they are there already."""
    packs, _ = row_geometry(H)
    i = row * packs + pack_index(k)
    lines = [ll_half_lines(regions, i, half) for half in range(2)]
    first = [ll_first_reads(half_lines) for half_lines in lines]
    sums = [ll_half_sum(lines[h], first[h], epoch, tag, limit, me, rank, T) for h in range(2)]
    return [a.to(T).to_f32() for a in sums[0] + sums[1]]


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_ll(x: Ptr["T"], residual: Ptr["T"], weight: Ptr["T"], out: Ptr["T"],
                    residual_out: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32],
                    sig: PeerPtrs[dsl.i32], ll: PeerPtrs[dsl.i32], rank: dsl.i32, rows: dsl.i32,
                    lines_per_peer: dsl.i32, eps: dsl.f32, flags: dsl.i32, call: dsl.CallId,
                    T: constexpr, H: constexpr, W: constexpr, FP8: constexpr,
                    B: constexpr = NORM_BLOCK, M: constexpr = 0):
    # B: the threads of a row (_row_slots.norm_block); M: the blocks per SM it must fit
    # (_row_slots.collective_min_blocks)
    me = sig[rank]
    epoch = next_ll_epoch(dsl.load(me + (layout.SIG_LL_EPOCH + dsl.block_id())))
    # as allreduce_ll: a rank whose record was set when the launch started pushes TAG_ABORT
    # and does not spin
    sticky = dsl.load(me + layout.SIG_ERROR)
    limit = dsl.select(sticky == 0, dsl.load(me + layout.SIG_SPIN_LIMIT), 0)
    tag = dsl.select(sticky == 0, call, call | layout.TAG_ABORT)
    bank_base = (epoch & 1) * (W * lines_per_peer)
    packs, per_thread = row_geometry(H)
    src = x.cast(dsl.i32x4)
    for row in range(dsl.block_id(), rows, dsl.num_blocks()):
        for k in range(per_thread):
            if pack_valid(H, k):
                i = row * packs + pack_index(k)
                ll_push_pack(src[i], i, ll, rank, epoch, epoch ^ tag, bank_base,
                             lines_per_peer, W)
    regions = ll_regions(ll, rank, bank_base, lines_per_peer, W)
    residual_norm_block_rows(
        lambda row, k: ll_reduced_pack(regions, row, k, H, T, epoch, call, limit, me, rank),
        rows, 1, H, T, residual, residual_out, weight, eps, flags, out, q, scale, FP8)
    advance_ll_epoch(me, epoch)


# W = 8 is not built: it spilled 4-76 bytes at H >= 6144 under sm_90's 128 registers, and it
# cannot be timed on the one lent GPU; the two launches serve it
FUSED_LL_WORLDS = (2, 4)


def variants(target):
    if not getattr(target, "is_nvidia", False):
        return []
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "B": norm_block(target, H),
             "M": collective_min_blocks(norm_block(target, H))}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in FUSED_LL_WORLDS]


register("fused_ar_rms_ll", fused_ar_rms_ll, variants)
