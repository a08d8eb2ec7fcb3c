"""One-stage all-reduce: every rank reads every peer's registered input and sums in rank
order (SPEC 2.1), between a start barrier (inputs staged) and an end barrier (done reading)."""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import BLOCK, WORLDS, global_thread, grid_threads, rank_order_sum
from .registry import register


@dsl.kernel(block_size=BLOCK)
def allreduce_1stage(inp: RegisteredPtrs["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                     n_packs: dsl.i32, call: dsl.CallId, T: constexpr, W: constexpr):
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    P = dsl.vec16(T)
    for i in range(global_thread(), signal.bound(n_packs), grid_threads()):
        acc = rank_order_sum([inp[r].cast(P)[i] for r in range(W)])
        out.cast(P)[i] = dsl.pack_rne(acc, T)
    signal.end()


def variants(target):
    return [{"T": T, "W": W} for T in (dsl.bf16, dsl.f16) for W in WORLDS]


register("allreduce_1stage", allreduce_1stage, variants)
