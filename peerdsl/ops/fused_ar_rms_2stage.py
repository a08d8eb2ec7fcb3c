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
(the same body and bytes; each thread's shard sources are computed once, before the rows).

Schedules (constexprs with the same bytes, picked per target by runtime/dispatch.py
`FUSED_2STAGE`; AMD targets build the defaults only): U, stage 1's shard packs per thread in
flight (0: one per row, rows outer; U >= 1: the block's rows x shard as one index space, U
indices per iteration); V, stage 2's rows per block per iteration, every pack of the V rows
read before the first store; E, the end barrier (E = 0 is safe for the reason
allreduce_2stage's docstring gives: peers read this rank's input only in stage 1, closed by
the phase barrier, and its staging only in stage 2, overwritten only after a later launch's
start barrier); S = 1, stage 1 alone, ending at the phase barrier: stage 2 is then its own
launch (ops/fused_ar_rms_gather.py) with a grid of one block per row, since it waits for
no peer and so needs no residency cap (a collective's grid is one block per SM per rank
under MPS). The same staging argument covers it: the next launch's start barrier comes
after every rank's gather on its stream.
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import WORLDS, rank_order_sum
from ._rows import (NORM_BLOCK, PACK, RUNTIME_MAXH, SUPPORTED_HIDDEN, RuntimeHidden,
                    collective_min_blocks, norm_block, pack_index, residual_norm_block_rows,
                    row_geometry, slot_pack)
from .registry import register


def shard_source(staging, H, T, W, k):
    """Where this thread's k-th pack of row 0 lies: in the staging of the rank that owns
    its shard, at the pack's index in that shard (row r's is r shards further). One pointer
    per slot, not an owner and an offset: one register pair fewer for each slot to hold."""
    packs, _ = row_geometry(H)
    shard = packs // W
    p = pack_index(k)  # (a slot past the row: an owner past W, a pointer never read)
    owner = p // shard
    return staging[owner].cast(dsl.vec16(T)) + (p - owner * shard)


def gathered_pack(staging, row, H, T, W, k, source=None):
    """This thread's k-th pack of the row, read from the staging of the rank that owns its
    shard (`source`: its shard_source, when computed ahead)."""
    packs, _ = row_geometry(H)
    shard = packs // W
    if source is None:  # (the specialized kernel's code, unchanged)
        p = pack_index(k)
        owner = p // shard
        return staging[owner].cast(dsl.vec16(T))[row * shard + (p - owner * shard)].to_f32()
    return slot_pack(source, row * shard, H, k).to_f32()


def two_stage(signal, inp, staging, residual, weight, out, residual_out, q, scale, rank, rows,
              eps, flags, T, H, W, FP8, R=1, U=0, V=1, E=1, S=0):
    """The kernel body, given its Signal (tests pass a deliberately broken one)."""
    sources = shard_sources(staging, H, T, W)
    signal.start()
    # stage 1 alone (S = 1) streams the inputs, each read once, so that the shards it
    # writes, which every rank's gather reads next, stay in L2
    if U == 0:
        reduce_scatter_rows(inp, staging, rank, signal.bound(rows), H, T, W, bool(S))
    else:
        reduce_scatter_flat(inp, staging, rank, signal.bound(rows), H, T, W, U, bool(S))
    signal.sync()
    if S:  # stage 2 is fused_ar_rms_gather's launch, after this one on the same stream
        signal.finish()
        return
    gather_norm_rows(staging, residual, weight, out, residual_out, q, scale, signal.bound(rows),
                     eps, flags, T, H, W, FP8, R, V, sources)
    if E:
        signal.end()
    else:
        signal.finish()


def shard_sources(staging, H, T, W):
    """Each pack slot's shard_source where H is a RuntimeHidden, else Nones. A runtime shard
    size makes each owner a division by a run-time value: done once per slot, before the
    rows (the specialized kernel divides by a constant, inline)."""
    per_thread = row_geometry(H)[1]
    if isinstance(H, RuntimeHidden):
        return [shard_source(staging, H, T, W, k) for k in range(per_thread)]
    return [None] * per_thread


def gather_norm_rows(staging, residual, weight, out, residual_out, q, scale, n, eps, flags,
                     T, H, W, FP8, R, V, sources):
    """Stage 2: this block's rows b, b + G, ... < n gathered from the owners' staging and
    normalized, V rows per iteration (all their packs read before the first store)."""
    residual_norm_block_rows(lambda r, k: gathered_pack(staging, r, H, T, W, k, sources[k]),
                             n, V, H, T, residual, residual_out, weight, eps, flags, out, q,
                             scale, FP8, R)

def shard_pack(inp, rank, row, j, H, T, W, once=False):
    """Shard pack j of `row`: summed in rank order from every rank's input (loads only;
    `once`: streamed, dsl.streaming)."""
    packs, _ = row_geometry(H)
    shard = packs // W
    sources = [inp[r].cast(dsl.vec16(T)) for r in range(W)]
    if once:
        sources = [dsl.streaming(p) for p in sources]
    return rank_order_sum([p[row * packs + rank * shard + j] for p in sources])


def reduce_scatter_rows(inp, staging, rank, rows, H, T, W, once=False):
    """Stage 1, U = 0: one shard pack per thread per row, rows outer (the AMD build's loop)."""
    packs, _ = row_geometry(H)
    shard = packs // W
    mine = staging[rank].cast(dsl.vec16(T))
    for row in range(dsl.block_id(), rows, dsl.num_blocks()):
        for j in range(dsl.thread_id(), shard, dsl.block_size()):
            mine[row * shard + j] = dsl.pack_rne(shard_pack(inp, rank, row, j, H, T, W, once),
                                                 T)


def reduce_scatter_flat(inp, staging, rank, rows, H, T, W, U, once=False):
    """Stage 1 with U shard packs per thread in flight: this block's rows (b, b + G, ...)
    times the shard, as one index space f = local_row * shard + j over the block's threads,
    U indices per thread per iteration with every load issued before the first store.

    Why: with rows outer, a shard narrower than the block (H=6144 at TP4: 192 packs for
    256 threads; H=2880: 90) idles threads, and each thread has only W loads in flight per
    iteration, while under MPS each rank's block is alone on its SM. Block b still covers
    exactly its own rows, so the per-block phase barrier covers what stage 2 reads. An index
    past the block's work reloads index f (in range) and skips its store."""
    packs, _ = row_geometry(H)
    shard = packs // W
    mine = staging[rank].cast(dsl.vec16(T))
    b, stride = dsl.block_id(), dsl.num_blocks()
    # rows of this block: b < stride, so the numerator is >= 0 even when rows is 0
    work = (rows - b + stride - 1) // stride * shard
    threads = dsl.block_size()
    for f in range(dsl.thread_id(), work, threads * U):
        idx = [f] + [dsl.select(f + u * threads < work, f + u * threads, f)
                     for u in range(1, U)]
        valid = [True] + [f + u * threads < work for u in range(1, U)]
        local = [i // shard for i in idx]
        sums = [shard_pack(inp, rank, b + lr * stride, i - lr * shard, H, T, W, once)
                for i, lr in zip(idx, local)]
        for u in range(U):
            if valid[u]:
                mine[(b + local[u] * stride) * shard + idx[u] - local[u] * shard] = \
                    dsl.pack_rne(sums[u], T)


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_2stage(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"], residual: Ptr["T"],
                        weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                        q: Ptr[dsl.i8], scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32],
                        rank: dsl.i32, rows: dsl.i32, eps: dsl.f32, flags: dsl.i32,
                        call: dsl.CallId, T: constexpr, H: constexpr, W: constexpr,
                        FP8: constexpr, R: constexpr = 1, U: constexpr = 0,
                        V: constexpr = 1, E: constexpr = 1, S: constexpr = 0,
                        B: constexpr = NORM_BLOCK, M: constexpr = 0):
    # R: packs of a row read before any is stored (0: the whole row), per target; U, V, E,
    # S: the module docstring; B: the threads of a row (_row_slots.norm_block); M: the
    # blocks per SM it must fit (_row_slots.collective_min_blocks)
    two_stage(dsl.Signal(sig, rank, W, call=call), inp, staging, residual, weight, out,
              residual_out, q, scale, rank, rows, eps, flags, T, H, W, FP8, R, U, V, E, S)


@dsl.kernel(block_size="B", min_blocks="M")
def fused_ar_rms_2stage_runtime_h(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"],
                                  residual: Ptr["T"], weight: Ptr["T"], out: Ptr["T"],
                                  residual_out: Ptr["T"], q: Ptr[dsl.i8], scale: Ptr[dsl.f32],
                                  sig: PeerPtrs[dsl.i32], rank: dsl.i32, rows: dsl.i32,
                                  hidden: dsl.i32, eps: dsl.f32, flags: dsl.i32,
                                  call: dsl.CallId, T: constexpr, MAXH: constexpr,
                                  W: constexpr, FP8: constexpr, R: constexpr = 1,
                                  U: constexpr = 0, V: constexpr = 1, E: constexpr = 1,
                                  S: constexpr = 0, B: constexpr = NORM_BLOCK,
                                  M: constexpr = 0):
    two_stage(dsl.Signal(sig, rank, W, call=call), inp, staging, residual, weight, out,
              residual_out, q, scale, rank, rows, eps, flags, T, RuntimeHidden(hidden, MAXH), W,
              FP8, R, U, V, E, S)


def variants(target):
    return [{**v, **k} for v in _base_variants(target)
            for k in schedules(target, v["H"], v["W"], v["B"])]


def _base_variants(target):
    return [{"T": T, "H": H, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "B": norm_block(target, H), "M": collective_min_blocks(norm_block(target, H))}
            for T in (dsl.bf16, dsl.f16) for H in SUPPORTED_HIDDEN for W in WORLDS
            if (H // PACK) % W == 0]


def runtime_h_variants(target):
    return [{"T": T, "MAXH": M, "W": W, "FP8": target.fp8_format, "R": target.row_reads_ahead,
             "B": NORM_BLOCK, **k}
            for T in (dsl.bf16, dsl.f16) for M in RUNTIME_MAXH for W in WORLDS
            for k in schedules(target, M, W)]


# sm_90 schedules: the default (U=0, V=1, E=1) and those the sweep compares; E = 0 with all;
# and stage 1 alone (S = 1) at U = SPLIT_UNROLL as fitted, for the gather launch after it
SM90_SCHEDULES = ((4, 1), (2, 2), (4, 2))
SPLIT_UNROLL = 4


def fitted_schedule(H: int, W: int, U: int, V: int, threads: int = NORM_BLOCK,
                    split: bool = False) -> tuple[int, int]:
    """(U, V) cut to what fits sm_90's 128 registers per thread without spilling (from the
    build's resources), for a hidden size or a runtime-H bound H alike (the runtime-H
    kernel's predicated slots, ops/_row_slots.py slot_pack, fit the same schedules): stage 1
    holds U x W loaded packs (at most 16), stage 2 V rows of a thread's packs (at most 6).
    W = 8 and, in one launch, bounds of more than 4 packs per thread (MAXH 12288 and 16384)
    keep the default schedule: their other schedules spilled 8-104 bytes, and W = 8 cannot
    be measured on the one lent GPU. Stage 1 alone holds no row, so there those bounds take
    U x W = 16 too (112 registers at W = 4, no spill). With more than NORM_BLOCK `threads`
    a row the kernel fits 2 blocks per SM (_row_slots.collective_min_blocks: 85 registers at
    384), where the one-launch kernel (not `split`) at U x W = 16 spilled 40 bytes (H = 2880,
    W = 4, V = 1): at most 8 there; stage 1 alone fit 16 (79 registers)."""
    per_thread = -(-H // (PACK * threads))
    if W > 4 or per_thread > 4 and not split:
        return 0, 1
    most = 8 if threads > NORM_BLOCK and not split else 16
    while U > 1 and U * W > most:
        U //= 2
    return U, (V if V * per_thread <= 6 else 1)


def schedules(target, H, W, threads=NORM_BLOCK):
    """The {U, V, E, S} a target builds for hidden size (or runtime-H bound) H and world W
    with `threads` a row: AMD targets only the defaults (named nowhere, so their kernels are
    the ones the gfx1250 PR measured); sm_90 also `SM90_SCHEDULES` as fitted, the ones
    runtime/dispatch.py `FUSED_2STAGE` picks from and `bench_ar_rms.py` sweeps."""
    if not getattr(target, "is_nvidia", False):
        return [{}]
    picks = {fitted_schedule(H, W, U, V, threads) for U, V in SM90_SCHEDULES} - {(0, 1)}
    split = {"U": fitted_schedule(H, W, SPLIT_UNROLL, 1, threads, split=True)[0], "V": 1,
             "E": 0, "S": 1}
    # S named in every schedule: a lookup that names S = 0 must not also match the split one
    return ([{"U": 0, "V": 1, "E": 1, "S": 0}]
            + [{"U": U, "V": V, "E": 0, "S": 0} for U, V in sorted(picks)] + [split])


register("fused_ar_rms_2stage", fused_ar_rms_2stage, variants)
register("fused_ar_rms_2stage_runtime_h", fused_ar_rms_2stage_runtime_h, runtime_h_variants)
