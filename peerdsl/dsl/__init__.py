"""The peerdsl kernel language: write a kernel with these, trace it, lower or simulate it."""
from . import ir
from .builder import TraceError
from .intrinsics import (abs, block_id, block_size, fma, fmaximum, globaltimer, lane_id,
                         maximum, minimum, num_blocks, rcp, rsqrt, schedule_fence, select,
                         shared_array, shfl_xor, sqrt, thread_id)
from .kernel import (CallId, Kernel, PeerPtrs, PeerTable, Ptr, RegisteredPtrs, constexpr,
                     dtype_of, kernel)
from .lib import (FP8_MAX, block_max, block_reduce, block_sum, group_reduce, pack_rne,
                  to_fp8)
from .memory import (atomic, atomic_add, atomic_cas, atomic_max, atomic_xchg, barrier, fence,
                     load, shared_barrier, store)
from .signal import Signal, record_error, spin_limit, spin_until_ge, staged_ok, wge, wlt
from .transform import plain
from .values import Pointer, Scalar, Vector, as_scalar, pack, streaming

i1, i8, i32, i64 = ir.i1, ir.i8, ir.i32, ir.i64
f16, bf16, f32 = ir.f16, ir.bf16, ir.f32
bf16x8 = ir.VectorType(ir.bf16, 8)
f16x8 = ir.VectorType(ir.f16, 8)
f32x4 = ir.VectorType(ir.f32, 4)
i32x4 = ir.VectorType(ir.i32, 4)
i8x16 = ir.VectorType(ir.i8, 16)
i8x8 = ir.VectorType(ir.i8, 8)


def vec16(elem: ir.ScalarType) -> ir.VectorType:
    """The 16-byte pack of elem (bf16x8, f16x8, f32x4, i32x4, i8x16)."""
    return ir.VectorType(elem, 16 // elem.nbytes)
