// Reference HIP kernel: LL all-reduce, bf16 (SPEC 3). Hand-written twin of
// peerdsl/ops/allreduce_ll.py: same line format {data0, epoch, data1, epoch}, banks by epoch
// parity, one LL epoch shared by every launch, kept as a copy per block index and advanced
// in every copy by each launch (block b of G writes copies b, b + G, ...), input read in place, all packs pushed before any is collected, sums in rank order.
// Builds for gfx1250 (clang -x hip) and sm_90 (nvcc).
#include "ref_common.h"

#pragma clang fp contract(off)

constexpr int BLOCK = 256;

// spin (bounded) until every rank's line of one half pack (line `at` of each rank's region,
// `stride` lines apart) has both flag words equal to the epoch, each poll re-reading all W
// lines (the DSL kernel re-reads only those not there yet: the same registers, where a
// branch per line here took clang to 354 VGPRs at W = 8)
template <int W>
__device__ __forceinline__ void wait_lines(const gvec* mine, int at, int stride, int epoch,
                                           gint* me, int rank, i32x4* v) {
  for (int r = 0; r < W; ++r) v[r] = ref_ld_volatile(mine + (at + r * stride));
  const int limit = spin_limit(me);
  for (int n = 0; n < limit; ++n) {
    bool all = true;
    for (int r = 0; r < W; ++r) all = all && v[r].y == epoch && v[r].w == epoch;
    if (all) return;
    for (int r = 0; r < W; ++r) v[r] = ref_ld_volatile(mine + (at + r * stride));
  }
  for (int r = 0; r < W; ++r) {
    if (v[r].y != epoch || v[r].w != epoch) {
      record_error(me, rank, WAIT_LL, epoch, v[r].y);
      return;
    }
  }
}

// the 4 bf16 data values of a line: the low and high halves of words 0 and 2
__device__ __forceinline__ void line_values(i32x4 v, float* f) {
  f[0] = bf_lo((unsigned)v.x); f[1] = bf_hi((unsigned)v.x);
  f[2] = bf_lo((unsigned)v.z); f[3] = bf_hi((unsigned)v.z);
}

template <int W>
__device__ __forceinline__ void ll_body(const hip_bfloat16* x, hip_bfloat16* out,
                                        const Peers<int>& sig, const Peers<int>& ll, int rank,
                                        int n_packs, int lines_per_peer) {
  gint* me = sig.p[rank];
  const int epoch = me[REF_SIG_LL_EPOCH + ref_block_id()] + 1;
  const int bank_base = (epoch & 1) * (W * lines_per_peer);
  const int grid_threads = ref_num_blocks(BLOCK) * BLOCK;
  const gvec* mine = (const gvec*)ll.p[rank];
  const int first_i = ref_block_id() * BLOCK + ref_thread_id();
  // push every pack first, then collect: a thread never waits for peers between its packs
  for (int i = first_i; i < n_packs; i += grid_threads) {
    const i32x4 words = ((const gvec*)x)[i];
    const i32x4 first = ref_i32x4(words.x, epoch, words.y, epoch);
    const i32x4 second = ref_i32x4(words.z, epoch, words.w, epoch);
    const int slot = bank_base + rank * lines_per_peer + 2 * i;
    for (int r = 0; r < W; ++r) {
      gvec* lines = (gvec*)ll.p[r];
      ref_st_volatile(lines + slot, first);
      ref_st_volatile(lines + (slot + 1), second);
    }
  }
  for (int i = first_i; i < n_packs; i += grid_threads) {
    F8 acc;
    for (int half = 0; half < 2; ++half) {  // line 0: elements 0-3, line 1: 4-7
      i32x4 v[W];
      wait_lines<W>(mine, bank_base + 2 * i + half, lines_per_peer, epoch, me, rank, v);
      for (int r = 0; r < W; ++r) {
        float f[4];
        line_values(v[r], f);
        for (int j = 0; j < 4; ++j) {
          if (r == 0) acc.v[4 * half + j] = f[j];  // from x_0, not 0 + x_0 (keeps a -0 sum)
          else acc.v[4 * half + j] = acc.v[4 * half + j] + f[j];
        }
      }
    }
    ((gvec*)out)[i] = pack_rne(acc);
  }
  __syncthreads();  // every thread of the block has read copy b of the epoch
  const int copy = ref_block_id() + ref_thread_id() * ref_num_blocks(BLOCK);
  if (copy < REF_MAX_BLOCKS) me[REF_SIG_LL_EPOCH + copy] = epoch;
}

// allreduce_ll_bf16_w<W>
#define REF_LL(W)                                                                             \
  extern "C" __global__ REF_LAUNCH_BOUNDS(256) void allreduce_ll_bf16_w##W(                  \
      const hip_bfloat16* x, hip_bfloat16* out, REF_GRID_CONST Peers<int> sig,               \
      REF_GRID_CONST Peers<int> ll, int rank, int n_packs, int lines_per_peer) {             \
    ll_body<W>(x, out, sig, ll, rank, n_packs, lines_per_peer);                              \
  }
REF_LL(2)
REF_LL(4)
REF_LL(8)
