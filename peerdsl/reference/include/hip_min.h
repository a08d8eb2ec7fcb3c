// hip_min.h: the few HIP spellings the reference kernels need, for clang -x hip with
// -nogpuinc (no ROCm headers: Debian's HIP 5.2 headers predate gfx1250). Under nvcc the
// same names come from hip_to_cuda.h instead, so one source builds for gfx1250 and sm_90.
#pragma once
#if defined(__CUDACC__)
#include "hip_to_cuda.h"
#else
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
// The DSL kernels declare max_flat_workgroup_size = their block size; match it so the
// register allocator gets the same budget (HIP's default max is 1024 threads).
#define REF_LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define REF_GRID_CONST
// Pointers into global memory. Peer pointers come out of a struct parameter indexed at run
// time, where clang cannot infer the address space: without this they become flat_* accesses
// while the DSL's are global_* (its pointers are !llvm.ptr<1>).
#define REF_GLOBAL __attribute__((address_space(1)))

typedef __bf16 hip_bfloat16;
typedef unsigned u32x4 __attribute__((ext_vector_type(4)));
typedef int i32x4 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ int ref_thread_id() { return __builtin_amdgcn_workitem_id_x(); }
__device__ __forceinline__ int ref_block_id() { return __builtin_amdgcn_workgroup_id_x(); }
// grid_size_x of the dispatch packet counts work-items; the block size is a constant.
__device__ __forceinline__ int ref_num_blocks(int block) {
  return (int)(__builtin_amdgcn_grid_size_x() / (unsigned)block);
}

// A block-wide barrier that also orders LDS and global accesses inside the workgroup
// (what gpu.barrier lowers to in the DSL: release fence, s_barrier, acquire fence).
__device__ __forceinline__ void __syncthreads() {
  __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
  __builtin_amdgcn_s_barrier();
  __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// x of lane (lane ^ mask) inside 32-lane groups. gfx1250 (wave32): DPP row_xmask for masks
// below 16 (inside a 16-lane row), v_permlanex16 (the other row, same lane) for 16. The
// wave64 targets (gfx942, gfx950) have no v_permlanex16: ds_bpermute by lane ^ mask there.
__device__ __forceinline__ float ref_shfl_xor(float x, int mask) {
  int v = __builtin_bit_cast(int, x), r;
#if defined(__gfx942__) || defined(__gfx950__)
  int lane = __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
  r = __builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, v);
#else
  switch (mask) {
    case 16: r = __builtin_amdgcn_permlanex16(v, v, 0x76543210, 0xfedcba98, false, false); break;
    case 8: r = __builtin_amdgcn_update_dpp(v, v, 0x168, 0xf, 0xf, false); break;
    case 4: r = __builtin_amdgcn_update_dpp(v, v, 0x164, 0xf, 0xf, false); break;
    case 2: r = __builtin_amdgcn_update_dpp(v, v, 0x162, 0xf, 0xf, false); break;
    default: r = __builtin_amdgcn_update_dpp(v, v, 0x161, 0xf, 0xf, false); break;
  }
#endif
  return __builtin_bit_cast(float, r);
}

// f32 -> bf16 bits, round to nearest even (v_cvt_pk_bf16_f32, as the DSL's arith.truncf).
__device__ __forceinline__ unsigned ref_f2bf(float x) {
  return __builtin_bit_cast(unsigned short, (__bf16)x);
}

// 16-byte accesses the DSL makes "volatile" (its system-scope relaxed vector loads/stores).
__device__ __forceinline__ i32x4 ref_ld_volatile(const REF_GLOBAL i32x4* p) {
  return *(const volatile REF_GLOBAL i32x4*)p;
}
__device__ __forceinline__ void ref_st_volatile(REF_GLOBAL i32x4* p, i32x4 v) {
  *(volatile REF_GLOBAL i32x4*)p = v;
}
__device__ __forceinline__ i32x4 ref_i32x4(int a, int b, int c, int d) { return i32x4{a, b, c, d}; }
#endif
