"""One-stage all-reduce: every rank reads every peer's registered input and sums in rank
order (SPEC 2.1), between a start barrier (inputs staged) and an end barrier (done reading),
whose arrival goes out after the last round's peer loads, before that round's stores.

U packs per thread per loop iteration (all U*W loads issued before the first sum) and B
threads per block are constexprs (`_collective.unrolled_grid_stride`, `ar_variants`); the
runtime picks them per target (runtime/dispatch.py `AR_KERNELS`) and sizes the grid by
B * U packs per block.
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import BLOCK, ar_variants, peer_packs, rank_order_sum, unrolled_grid_stride
from .registry import register


# two blocks per SM: the grid cap gives every rank sharing a GPU one block per SM, which must
# be resident together (benchmarks/RESULTS.md: an exact fit timed out under MPS)
@dsl.kernel(block_size="B", min_blocks=2)
def allreduce_1stage(inp: RegisteredPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                     n_packs: dsl.i32, call: dsl.CallId, T: constexpr, W: constexpr,
                     U: constexpr = 1, B: constexpr = BLOCK):
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    P = dsl.vec16(T)
    dst = out.cast(P)
    # the sum is part of the load step, so the last round holds one pack per index (not W)
    # across the end arrival, and its loads have returned before the block barrier there
    unrolled_grid_stride(signal.bound(n_packs), U,
                         lambda i: dsl.pack_rne(rank_order_sum(peer_packs(inp, P, W, i)), T),
                         dst.__setitem__, before_last_stores=signal.end_arrive)
    signal.end()


register("allreduce_1stage", allreduce_1stage, ar_variants)
