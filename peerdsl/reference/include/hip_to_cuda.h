// hip_to_cuda.h: the HIP spellings the reference kernels use, mapped to CUDA for nvcc
// (sm_90). Included by hip_min.h when __CUDACC__ is defined.
#pragma once
#include <cuda/atomic>
#include <cuda_bf16.h>

#define REF_LAUNCH_BOUNDS(n) __launch_bounds__(n)
// Peer tables are indexed at run time (p[rank]); without __grid_constant__ nvcc copies the
// whole struct parameter to local memory to take its address.
#define REF_GRID_CONST const __grid_constant__
#define REF_GLOBAL  // generic pointers: ptxas resolves them to global where it can

typedef __nv_bfloat16 hip_bfloat16;
typedef int4 i32x4;

// clang's values for these (HIP's amd_hip_atomic.h relies on them too)
#ifndef __HIP_MEMORY_SCOPE_SYSTEM
#define __HIP_MEMORY_SCOPE_SINGLETHREAD 1
#define __HIP_MEMORY_SCOPE_WAVEFRONT 2
#define __HIP_MEMORY_SCOPE_WORKGROUP 3
#define __HIP_MEMORY_SCOPE_AGENT 4
#define __HIP_MEMORY_SCOPE_SYSTEM 5
#endif
#ifndef __ATOMIC_RELAXED
#define __ATOMIC_RELAXED 0
#define __ATOMIC_ACQUIRE 2
#define __ATOMIC_RELEASE 3
#define __ATOMIC_ACQ_REL 4
#endif

__device__ __forceinline__ int ref_thread_id() { return threadIdx.x; }
__device__ __forceinline__ int ref_block_id() { return blockIdx.x; }
__device__ __forceinline__ int ref_num_blocks(int) { return gridDim.x; }

__device__ __forceinline__ float ref_shfl_xor(float x, int mask) {
  return __shfl_xor_sync(0xffffffffu, x, mask, 32);
}
__device__ __forceinline__ unsigned ref_f2bf(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));  // cvt.rn.bf16.f32
}

// The DSL's volatile 16-byte accesses (ld/st.volatile.global.v4).
__device__ __forceinline__ i32x4 ref_ld_volatile(const i32x4* p) {
  i32x4 v;
  asm volatile("ld.volatile.global.v4.b32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void ref_st_volatile(i32x4* p, i32x4 v) {
  asm volatile("st.volatile.global.v4.b32 [%0], {%1,%2,%3,%4};"
               :: "l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ i32x4 ref_i32x4(int a, int b, int c, int d) { return make_int4(a, b, c, d); }

// __hip_atomic_* on int words through cuda::atomic_ref of the matching thread scope. The
// order and scope are constants at every call, so the switches fold away.
#define REF_SCOPED(scope, EXPR)                                                      \
  switch (scope) {                                                                   \
    case __HIP_MEMORY_SCOPE_SYSTEM: { cuda::atomic_ref<int, cuda::thread_scope_system> a(*p); EXPR; } \
    case __HIP_MEMORY_SCOPE_AGENT: { cuda::atomic_ref<int, cuda::thread_scope_device> a(*p); EXPR; } \
    default: { cuda::atomic_ref<int, cuda::thread_scope_block> a(*p); EXPR; }        \
  }
#define REF_ORDER(o) static_cast<cuda::memory_order>(o)

__device__ __forceinline__ int __hip_atomic_load(int* p, int order, int scope) {
  REF_SCOPED(scope, return a.load(REF_ORDER(order)))
}
__device__ __forceinline__ void __hip_atomic_store(int* p, int v, int order, int scope) {
  REF_SCOPED(scope, a.store(v, REF_ORDER(order)); return)
}
__device__ __forceinline__ int __hip_atomic_fetch_add(int* p, int v, int order, int scope) {
  REF_SCOPED(scope, return a.fetch_add(v, REF_ORDER(order)))
}
__device__ __forceinline__ bool __hip_atomic_compare_exchange_strong(int* p, int* expected, int desired,
                                                                     int success, int failure, int scope) {
  REF_SCOPED(scope, return a.compare_exchange_strong(*expected, desired, REF_ORDER(success),
                                                     REF_ORDER(failure)))
}
