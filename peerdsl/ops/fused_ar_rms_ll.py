"""Fused LL all-reduce + add + RMSNorm (+ FP8 per-token, + T mirror): SPEC section 5's
`ll+rmsnorm` path in one launch, with no barrier.

First every thread of the grid pushes its share of the rows' packs, as the LL all-reduce does
(ops/allreduce_ll.py: the same lines, banks, epoch and tags, in every rank's scratch, spread
over the whole grid, which may have more blocks than rows). Then block b takes rows b, b + G,
...; thread t owns the packs of each row that the add + RMSNorm kernel gives it
(ops/_row_slots.py): it reads every rank's lines of all of them, waits for them in one spin,
sums them in rank order and rounds to T (the bytes the LL all-reduce stores), and runs the
add + RMSNorm epilogue (ops/_rows.py) on them. So out, residual_out and the FP8 bytes equal
those of the LL all-reduce followed by add_rmsnorm, and the input is read in place.

Built for NVIDIA targets only (runtime/built.py FUSED_LL_OP; the fused entry launches it for
`ll+rmsnorm` where it is built for H and W): AMD targets keep the two launches the gfx1250
PR measured.
"""
from .. import dsl, layout
from ..dsl import PeerPtrs, Ptr, constexpr
from ._rows import (NORM_BLOCK, SUPPORTED_HIDDEN, collective_min_blocks, norm_block,
                    pack_index, pack_valid, residual_norm_row, row_geometry)
from .allreduce_ll import (advance_ll_epoch, ll_first_reads, ll_half_lines, ll_lines_sum,
                           ll_push, ll_regions, next_ll_epoch, wait_lines)
from .registry import register


def _pack_lines(regions, row, H, k):
    """Every rank's two lines of this thread's k-th pack of the row, [half][rank]. A slot past
    the row (where the block's threads do not divide the row's packs) names pack 0's lines
    instead: every rank pushes them, so waiting for them costs nothing more, and that slot's
    sum is never used."""
    packs, _ = row_geometry(H)
    p = pack_index(k)
    valid = pack_valid(H, k)
    if valid is not True:
        p = dsl.select(valid, p, 0)
    return [ll_half_lines(regions, row * packs + p, half) for half in range(2)]


# Lines read before the first of their waits: the most that fit sm_90's 128 registers with
# no spill at every H and W (24 spilled 112-144 bytes at W = 4 from H = 6144; every line's 16
# bytes stay live until its half pack is summed)
LINES_PER_READ = 16


def row_sums(regions, row, H, T, W, epoch, tag, limit, me, rank):
    """This thread's packs of one row, each every rank's lines summed in rank order and
    rounded to T (as f32), as the LL all-reduce stores them, read through `row_pack`.

    The lines of LINES_PER_READ // W half packs (in pack order) are read before the first is
    waited for (allreduce_ll.wait_lines: a bounded spin over one half pack's W lines), so
    where the lines are there such a group costs one round trip, not one per pack. A group is
    read when its first pack is asked for, after the previous packs' residual_out stores, so
    its lines are not live beside theirs; where some slot lies past the row (its reads sit
    under a traced `if`), every group is read here, before any."""
    _, per_thread = row_geometry(H)
    halves = [(k, h) for k in range(per_thread) for h in range(2)]
    size = max(1, LINES_PER_READ // W)
    sums = {"where": (regions, row, H, T, W), "wait": (epoch, tag, limit, me, rank),
            "groups": [halves[i:i + size] for i in range(0, len(halves), size)], "summed": {}}
    if not all(pack_valid(H, k) is True for k in range(per_thread)):
        for group in sums["groups"]:
            _read_group(sums, group)
    return sums


def _read_group(sums, group):
    regions, row, H, T, W = sums["where"]
    lines = [_pack_lines(regions, row, H, k)[h] for k, h in group]
    reads = [ll_first_reads(half) for half in lines]
    for (k, h), half, read in zip(group, lines, reads):
        sums["summed"][k, h] = ll_lines_sum(wait_lines(half, read, *sums["wait"]), T)


def row_pack(sums, k):
    """The k-th pack of row_sums' row (its group read on first use)."""
    for group in sums["groups"]:
        if (k, 1) in group and (k, 1) not in sums["summed"]:
            _read_group(sums, group)
    T = sums["where"][3]
    return [a.to(T).to_f32() for a in sums["summed"][k, 0] + sums["summed"][k, 1]]


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
    packs, _ = row_geometry(H)
    # every block pushes a share of every row's packs (the grid may hold more blocks than
    # rows: those only push), so a few rows' pushes are spread as the LL all-reduce's are
    ll_push(x, ll, rank, epoch, bank_base, rows * packs, lines_per_peer, W, tag)
    regions = ll_regions(ll, rank, bank_base, lines_per_peer, W)
    for row in range(dsl.block_id(), rows, dsl.num_blocks()):
        sums = row_sums(regions, row, H, T, W, epoch, call, limit, me, rank)
        # (a lambda, not a nested def: the tracer rewrites nested defs' calls)
        residual_norm_row(lambda k: row_pack(sums, k), row, H, T, residual, residual_out, weight, eps,
                          flags, out, q, scale, FP8)
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
