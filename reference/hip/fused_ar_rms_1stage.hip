// Reference HIP kernel: fused one-stage all-reduce + add + RMSNorm, bf16 (SPEC 2, 3).
// Hand-written twin of peerdsl/ops/fused_ar_rms_1stage.py (without the FP8 / gemma /
// mirror epilogue options, i.e. the DSL kernel with flags = 0), same numerics and protocol,
// so both produce the same bytes. Builds for gfx1250 (clang -x hip) and sm_90 (nvcc).
#include "ref_common.h"

#pragma clang fp contract(off)  // the DSL never fuses a*b+c; neither may we (nvcc: --fmad=false)

constexpr int BLOCK = 256, PACK = 8;

// sum over the 32 lanes of a group (butterfly 16,8,4,2,1), then the group partials added
// serially in group order: the DSL's dsl.block_sum, bit for bit
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  for (int mask = 16; mask >= 1; mask >>= 1) x = x + ref_shfl_xor(x, mask);
  int t = ref_thread_id();
  if ((t & 31) == 0) scratch[t >> 5] = x;
  __syncthreads();
  float total = scratch[0];
  for (int g = 1; g < BLOCK / 32; ++g) total = total + scratch[g];
  __syncthreads();  // the scratch may be reused by the next row
  return total;
}

// the block's maximum of non-negative, non-NaN values (exact in any order: dsl.block_max's bits)
__device__ __forceinline__ float block_max(float x, float* scratch) {
  for (int mask = 16; mask >= 1; mask >>= 1) {
    const float y = ref_shfl_xor(x, mask);
    x = y > x ? y : x;
  }
  int t = ref_thread_id();
  if ((t & 31) == 0) scratch[t >> 5] = x;
  __syncthreads();
  float m = scratch[0];
  for (int g = 1; g < BLOCK / 32; ++g) m = scratch[g] > m ? scratch[g] : m;
  __syncthreads();
  return m;
}

template <int H, int W>
__device__ __forceinline__ void fused_body(const Peers<const hip_bfloat16>& inp,
                                           const hip_bfloat16* residual,
                                           const hip_bfloat16* weight, hip_bfloat16* out,
                                           hip_bfloat16* residual_out, const Peers<int>& sig,
                                           int rank, int rows, float eps) {
  constexpr int PACKS = H / PACK, PER_THREAD = (PACKS + BLOCK - 1) / BLOCK;
  __shared__ float scratch[32];
  const int t = ref_thread_id();
  SignalBarrier<W> signal(sig, rank);
  signal.start();
  for (int row = ref_block_id(); row < rows; row += ref_num_blocks(BLOCK)) {
    F8 s[PER_THREAD];
    for (int k = 0; k < PER_THREAD; ++k) {
      const int p = t + k * BLOCK;
      if (PACKS % BLOCK != 0 && p >= PACKS) continue;  // past the end of the row
      const int i = row * PACKS + p;
      F8 acc = unpack(((const gvec*)inp.p[0])[i]);  // from x_0, ranks in order
      for (int r = 1; r < W; ++r) {
        F8 x = unpack(((const gvec*)inp.p[r])[i]);
        for (int j = 0; j < PACK; ++j) acc.v[j] = acc.v[j] + x.v[j];
      }
      F8 res = unpack(((const gvec*)residual)[i]);
      for (int j = 0; j < PACK; ++j) s[k].v[j] = round_bf(acc.v[j]) + res.v[j];
      ((gvec*)residual_out)[i] = pack_rne(s[k]);
    }
    float sq = 0.0f;
    for (int k = 0; k < PER_THREAD; ++k) {
      if (PACKS % BLOCK != 0 && t + k * BLOCK >= PACKS) continue;  // zeros add nothing
      for (int j = 0; j < PACK; ++j) sq = sq + s[k].v[j] * s[k].v[j];
    }
    const float total = block_sum(sq, scratch);
    float inv = 1.0f / __builtin_sqrtf(total / (float)H + eps);  // both correctly rounded
    if (total == __builtin_bit_cast(float, 0x7f800000u)) {  // block-uniform, like total:
      // the f32 squares overflowed (or the row holds an inf). Power-of-two scaling, as ops/_rows.py overflow_safe_inv: p = 2^(127 - e) for the
      // row's largest |s_j| of biased exponent e (at least 2^-126), inv = rsqrt(sum (s p)^2
      // / H + eps p^2) * p
      float m = 0.0f;
      for (int k = 0; k < PER_THREAD; ++k) {
        if (PACKS % BLOCK != 0 && t + k * BLOCK >= PACKS) continue;
        for (int j = 0; j < PACK; ++j) {
          const unsigned bits = __builtin_bit_cast(unsigned, s[k].v[j]) & 0x7fffffffu;
          const float a = __builtin_bit_cast(float, bits);  // |s_j|
          m = a > m ? a : m;
        }
      }
      m = block_max(m, scratch);
      const int e = (int)((__builtin_bit_cast(unsigned, m) >> 23) & 0xFF);
      const float p = __builtin_bit_cast(float, (unsigned)(254 - e > 1 ? 254 - e : 1) << 23);
      float sq2 = 0.0f;
      for (int k = 0; k < PER_THREAD; ++k) {
        if (PACKS % BLOCK != 0 && t + k * BLOCK >= PACKS) continue;
        for (int j = 0; j < PACK; ++j) {
          const float v = s[k].v[j] * p;
          sq2 = sq2 + v * v;
        }
      }
      const float total2 = block_sum(sq2, scratch);
      inv = (1.0f / __builtin_sqrtf(total2 / (float)H + (eps * p) * p)) * p;
    }
    for (int k = 0; k < PER_THREAD; ++k) {
      const int p = t + k * BLOCK;
      if (PACKS % BLOCK != 0 && p >= PACKS) continue;
      F8 w = unpack(((const gvec*)weight)[p]), o;
      for (int j = 0; j < PACK; ++j) o.v[j] = (s[k].v[j] * inv) * w.v[j];
      ((gvec*)out)[row * PACKS + p] = pack_rne(o);
    }
  }
  signal.end();
}

// One extern "C" symbol per (H, W), as the DSL has one kernel per constexpr variant:
// fused_ar_rms_1stage_bf16_h<H>_w<W>.
#define REF_FUSED(H, W)                                                                       \
  extern "C" __global__ REF_LAUNCH_BOUNDS(256) void fused_ar_rms_1stage_bf16_h##H##_w##W(    \
      REF_GRID_CONST Peers<const hip_bfloat16> inp, const hip_bfloat16* residual,            \
      const hip_bfloat16* weight, hip_bfloat16* out, hip_bfloat16* residual_out,             \
      REF_GRID_CONST Peers<int> sig, int rank, int rows, float eps) {                        \
    fused_body<H, W>(inp, residual, weight, out, residual_out, sig, rank, rows, eps);        \
  }
#define REF_FUSED_W(H) REF_FUSED(H, 2) REF_FUSED(H, 4) REF_FUSED(H, 8)
REF_FUSED_W(2880)
REF_FUSED_W(4096)
REF_FUSED_W(6144)
REF_FUSED_W(7168)
REF_FUSED_W(8192)
