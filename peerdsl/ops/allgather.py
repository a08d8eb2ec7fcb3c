"""All-gather of registered inputs: out[r] = input of rank r, moved as 16-byte packs."""
from .. import dsl
from ..dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from ._collective import BLOCK, WORLDS, global_thread, grid_threads
from .registry import register


@dsl.kernel(block_size=BLOCK)
def allgather(inp: RegisteredPtrs[dsl.i32], out: Ptr[dsl.i32], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
              n_packs: dsl.i32, call: dsl.CallId, W: constexpr):
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    dst = out.cast(dsl.i32x4)
    for i in range(global_thread(), signal.bound(n_packs), grid_threads()):
        for r in range(W):
            dst[r * n_packs + i] = inp[r].cast(dsl.i32x4)[i]
    signal.end()


def variants(target):
    return [{"W": W} for W in WORLDS]


register("allgather", allgather, variants)
