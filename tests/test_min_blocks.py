"""dsl.kernel(min_blocks=...): the blocks per multiprocessor a kernel must fit. On NVIDIA it
sets the PTX launch bound (.minnctapersm), so ptxas caps the registers; AMD ignores it; bad
values are trace errors naming the limit."""
from __future__ import annotations

import pytest

from peerdsl import dsl
from peerdsl.dsl import Ptr, constexpr
from peerdsl.dsl.builder import TraceError
from peerdsl.dsl.ir import print_kernel


@dsl.kernel(block_size=256, min_blocks="M")
def _copy(x: Ptr[dsl.f32], y: Ptr[dsl.f32], M: constexpr = 0):
    i = dsl.block_id() * 256 + dsl.thread_id()
    y[i] = x[i] + 1.0


def _mlir(arch: str, **cx) -> str:
    from peerdsl.lowering.mlir_gen import generate
    from peerdsl.lowering.targets import get_target
    return generate(_copy.trace(**cx), get_target(arch))[0]  # (text, locations)


def test_min_blocks_reaches_the_ir_and_the_nvidia_launch_bound():
    assert _copy.trace(M=3).min_blocks == 3 and _copy.trace().min_blocks is None
    assert "min_blocks=3" in print_kernel(_copy.trace(M=3)).split("\n")[0]
    assert "min_blocks" not in print_kernel(_copy.trace()).split("\n")[0]  # cache keys kept
    assert "nvvm.minctasm = 3" in _mlir("sm_90", M=3)
    assert "nvvm.minctasm = 2" in _mlir("sm_90")  # the default: 128 registers at 256 threads
    assert "minctasm" not in _mlir("gfx1250", M=3)


@pytest.mark.parametrize("bad", [-1, 9, 2.5, True])
def test_min_blocks_out_of_range_is_a_trace_error(bad):
    with pytest.raises(TraceError, match="min_blocks"):
        _copy.trace(M=bad)
