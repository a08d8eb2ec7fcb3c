// ref_common.h: Signal layout, packs and the start/end barrier shared by the reference
// kernels. Mirrors peerdsl/layout.py and peerdsl/dsl/signal.py word for word; the builder
// (peerdsl/reference_build.py) passes the layout constants with -D from layout.py so they
// cannot drift, the defaults below are only for a hand build.
#pragma once
#include "hip_min.h"

#ifndef REF_MAX_RANKS
#define REF_MAX_RANKS 8
#endif
#ifndef REF_SIG_SLOTS
#define REF_SIG_SLOTS 0
#endif
#ifndef REF_SIG_EPOCH
#define REF_SIG_EPOCH 4096
#endif
#ifndef REF_MAX_BLOCKS
#define REF_MAX_BLOCKS 256
#endif
#ifndef REF_SIG_LL_EPOCH
#define REF_SIG_LL_EPOCH 4352  // [REF_MAX_BLOCKS] copies of the one LL epoch
#endif
#ifndef REF_SIG_SPIN_LIMIT
#define REF_SIG_SPIN_LIMIT 4608
#endif
#ifndef REF_SIG_ERROR
#define REF_SIG_ERROR 4609
#endif
enum { WAIT_START = 1, WAIT_END = 2, WAIT_LL = 3 };

// global-memory int words and 16-byte packs (REF_GLOBAL: see hip_min.h)
typedef REF_GLOBAL int gint;
typedef REF_GLOBAL i32x4 gvec;

template <typename P> struct Peers { REF_GLOBAL P* p[REF_MAX_RANKS]; };  // one pointer per rank

// ---------------------------------------------------------------- 16-byte bf16 packs
struct F8 { float v[8]; };

__device__ __forceinline__ float bf_lo(unsigned w) { return __builtin_bit_cast(float, w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __builtin_bit_cast(float, w & 0xffff0000u); }

__device__ __forceinline__ F8 unpack(i32x4 q) {
  unsigned w[4] = {(unsigned)q.x, (unsigned)q.y, (unsigned)q.z, (unsigned)q.w};
  F8 f;
  for (int k = 0; k < 4; ++k) { f.v[2 * k] = bf_lo(w[k]); f.v[2 * k + 1] = bf_hi(w[k]); }
  return f;
}

// each element rounded to bf16 separately (nearest even), element 2k in the low half
__device__ __forceinline__ i32x4 pack_rne(const F8& f) {
  int w[4];
  for (int k = 0; k < 4; ++k) w[k] = (int)(ref_f2bf(f.v[2 * k]) | (ref_f2bf(f.v[2 * k + 1]) << 16));
  return ref_i32x4(w[0], w[1], w[2], w[3]);
}

__device__ __forceinline__ float round_bf(float x) { return bf_lo(ref_f2bf(x)); }

// ---------------------------------------------------------------- errors and spins
// First failing spin writes (rank, block, what, expected, seen) for the host to raise on.
__device__ __forceinline__ void record_error(gint* sig, int rank, int what, int expected, int seen) {
  gint* err = sig + REF_SIG_ERROR;
  int zero = 0;
  if (__hip_atomic_compare_exchange_strong(err, &zero, 1, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE,
                                           __HIP_MEMORY_SCOPE_SYSTEM)) {
    __hip_atomic_store(err + 1, rank, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(err + 2, ref_block_id(), __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(err + 3, what, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(err + 4, expected, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
    __hip_atomic_store(err + 5, seen, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  }
}

// The host's spin limit, or 0 once any spin of this rank has expired: after the first
// timeout every later wait gives up at once (a dead peer costs one timeout, not one per wait).
__device__ __forceinline__ int spin_limit(gint* sig) {
  int expired = __hip_atomic_load(sig + REF_SIG_ERROR, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_SYSTEM);
  int limit = sig[REF_SIG_SPIN_LIMIT];
  return expired != 0 ? 0 : limit;
}

// acquire-load flag until >= target, at most spin_limit() times
__device__ __forceinline__ void spin_until_ge(gint* flag, int target, gint* sig, int rank, int what) {
  int limit = spin_limit(sig);
  int seen = __hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
  for (int n = 0; seen < target && n < limit; ++n)
    seen = __hip_atomic_load(flag, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_SYSTEM);
  if (seen < target) record_error(sig, rank, what, target, seen);
}

// ---------------------------------------------------------------- Signal barriers
// Block b of every rank meets at slot [b][peer]; epochs come from this block's counter in
// device memory (base + k for the k-th barrier of the launch), compared with >=.
template <int W> struct SignalBarrier {
  const Peers<int>& peers;
  int rank, block, base, used;
  gint* me;
  __device__ SignalBarrier(const Peers<int>& s, int r)
      : peers(s), rank(r), block(ref_block_id()), used(0), me(s.p[r]) {
    base = me[REF_SIG_EPOCH + block];
  }
  __device__ void arrive_and_wait(int what) {
    int epoch = base + (++used);
    int t = ref_thread_id();
    if (t < W) {
      gint* slot = peers.p[t] + REF_SIG_SLOTS + block * REF_MAX_RANKS + rank;
      __hip_atomic_store(slot, epoch, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_SYSTEM);
      spin_until_ge(me + REF_SIG_SLOTS + block * REF_MAX_RANKS + t, epoch, me, rank, what);
    }
    __syncthreads();
  }
  // the block barrier first makes the release cover what every wave of the block wrote
  __device__ void start() {
    __syncthreads();
    arrive_and_wait(WAIT_START);
  }
  // peers may overwrite what was read; also persists this block's epoch, so call it last
  __device__ void end() {
    __syncthreads();
    arrive_and_wait(WAIT_END);
    if (ref_thread_id() == 0) me[REF_SIG_EPOCH + block] = base + used;
  }
};
