"""Two-stage all-reduce: reduce-scatter (rank r sums shard r in rank order into its staging),
a phase barrier, then all-gather of the shards from the peers' staging.

Block b of every rank handles the same shard-relative indices in both stages, so the
per-block Signal barrier between the stages covers exactly the data block b reads.
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import BLOCK, WORLDS, global_thread, grid_threads, rank_order_sum
from .registry import register


@dsl.kernel(block_size=BLOCK)
def allreduce_2stage(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"], out: Ptr["T"],
                     sig: PeerPtrs[dsl.i32], rank: dsl.i32, shard_packs: dsl.i32,
                     call: dsl.CallId, T: constexpr, W: constexpr):
    # shard_packs: packs per shard; the input holds W * shard_packs packs (padded by the host)
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    P = dsl.vec16(T)
    for j in range(global_thread(), signal.bound(shard_packs), grid_threads()):
        i = rank * shard_packs + j
        acc = rank_order_sum([inp[r].cast(P)[i] for r in range(W)])
        staging[rank].cast(P)[j] = dsl.pack_rne(acc, T)
    signal.sync()
    for j in range(global_thread(), signal.bound(shard_packs), grid_threads()):
        for r in range(W):
            out.cast(P)[r * shard_packs + j] = staging[r].cast(P)[j]
    signal.end()


def variants(target):
    return [{"T": T, "W": W} for T in (dsl.bf16, dsl.f16) for W in WORLDS]


register("allreduce_2stage", allreduce_2stage, variants)
