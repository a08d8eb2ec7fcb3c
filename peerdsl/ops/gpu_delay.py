"""A GPU-side delay: the kernel spins on the nanosecond timer. Tests use it to start each
rank's collective late by a different amount (adversarial skew on real hardware)."""
from .. import dsl
from ..dsl import Ptr
from .registry import register


@dsl.kernel(block_size=32)
def gpu_delay(sink: Ptr[dsl.i32], nanoseconds: dsl.i64):
    start = dsl.globaltimer()
    now = start
    spins = 0
    while (now - start < nanoseconds) and spins < 200_000_000:  # bounded even if the timer stalls
        now = dsl.globaltimer()
        spins = spins + 1
    if dsl.thread_id() == 0:
        sink[0] = spins  # keeps the loop observable


def variants(target):
    return [{}]


register("gpu_delay", gpu_delay, variants)
