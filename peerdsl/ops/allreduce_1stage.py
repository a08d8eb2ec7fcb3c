"""One-stage all-reduce: every rank reads every peer's registered input and sums in rank
order (SPEC 2.1), between a start barrier (inputs staged) and an end barrier (done reading).

U packs per thread per loop iteration (all U*W loads issued before the first sum) and B
threads per block are constexprs (`_collective.unrolled_grid_stride`, `ar_variants`); the
runtime picks them per target (runtime/dispatch.py `AR_KERNELS`) and sizes the grid by
B * U packs per block.
"""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import BLOCK, ar_variants, peer_packs, store_sum, unrolled_grid_stride
from .registry import register


@dsl.kernel(block_size="B")
def allreduce_1stage(inp: RegisteredPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                     n_packs: dsl.i32, call: dsl.CallId, T: constexpr, W: constexpr,
                     U: constexpr = 1, B: constexpr = BLOCK):
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    P = dsl.vec16(T)
    dst = out.cast(P)
    unrolled_grid_stride(signal.bound(n_packs), U, lambda i: peer_packs(inp, P, W, i),
                         lambda i, packs: store_sum(dst, i, packs, T))
    signal.end()


register("allreduce_1stage", allreduce_1stage, ar_variants)
