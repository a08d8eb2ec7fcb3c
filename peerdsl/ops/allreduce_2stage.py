"""Two-stage all-reduce: reduce-scatter (rank r sums shard r in rank order into its staging),
a phase barrier, then all-gather of the shards from the peers' staging.

Block b of every rank handles the same shard-relative indices in both stages, so the
per-block Signal barrier between the stages covers exactly the data block b reads.

U packs per thread per iteration (every load of an iteration issued before its first
store), B threads per block and E (end barrier) are constexprs, picked per target by
runtime/dispatch.py `AR_KERNELS`. E = 0 drops the end barrier, as vLLM's two-stage kernel
does: peers read this rank's input only in stage 1, which the phase barrier closes, and its
staging only in stage 2, which a later kernel overwrites only after its own start barrier,
which no peer's block reaches before this launch has finished on that peer (stream order).
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import BLOCK, ar_variants, peer_packs, store_sum, unrolled_grid_stride
from .registry import register


@dsl.kernel(block_size="B")
def allreduce_2stage(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"], out: Ptr["T"],
                     sig: PeerPtrs[dsl.i32], rank: dsl.i32, shard_packs: dsl.i32,
                     call: dsl.CallId, T: constexpr, W: constexpr, U: constexpr = 1,
                     B: constexpr = BLOCK, E: constexpr = 1):
    # shard_packs: packs per shard; the input holds W * shard_packs packs (padded by the host)
    two_stage(dsl.Signal(sig, rank, W, call=call), inp, staging, out, rank, shard_packs, T, W,
              U, E)


def two_stage(signal, inp, staging, out, rank, shard_packs, T, W, U, E) -> None:
    """The kernel body, given its Signal (tests run two calls in one launch through it)."""
    signal.start()
    P = dsl.vec16(T)
    mine, dst = staging[rank].cast(P), out.cast(P)
    unrolled_grid_stride(signal.bound(shard_packs), U,
                         lambda j: peer_packs(inp, P, W, rank * shard_packs + j),
                         lambda j, packs: store_sum(mine, j, packs, T))
    signal.sync()
    unrolled_grid_stride(signal.bound(shard_packs), U, lambda j: peer_packs(staging, P, W, j),
                         lambda j, packs: _scatter(dst, shard_packs, j, packs))
    if E:
        signal.end()
    else:
        signal.finish()


def _scatter(out, shard_packs, j, packs) -> None:
    """Shard r's pack j to out[r * shard_packs + j], after every shard's load was issued."""
    for r, v in enumerate(packs):
        out[r * shard_packs + j] = v


def variants(target):
    """`ar_variants`, and on sm_90 each also without the end barrier (E = 0)."""
    base = ar_variants(target)
    if not getattr(target, "is_nvidia", False):
        return base
    return [{**v, "E": E} for v in base for E in (0, 1)]


register("allreduce_2stage", allreduce_2stage, variants)
