"""The null collective: a launch and one Signal barrier, nothing else. The latency floor the
small-row collectives are measured against."""
from .. import dsl
from ..dsl import PeerPtrs, constexpr
from ._collective import WORLDS
from .registry import register


@dsl.kernel(block_size=256)
def null_collective(sig: PeerPtrs[dsl.i32], rank: dsl.i32, call: dsl.CallId, W: constexpr):
    signal = dsl.Signal(sig, rank, W, call=call)
    signal.start()
    signal.finish()


def variants(target):
    return [{"W": W} for W in WORLDS]


register("null_collective", null_collective, variants)
