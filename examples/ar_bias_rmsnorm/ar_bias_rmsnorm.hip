// Hand-written HIP twin of examples/ar_bias_rmsnorm/ar_bias_rmsnorm.py (bf16): all-reduce +
// bias + residual + RMSNorm in one stage, the same numerics, thread mapping and Signal
// protocol as the DSL kernel, so both write the same bytes. Builds for gfx1250 with clang-22
// and for sm_90 with nvcc against the project's reference/hip headers:
//   clang++-22 -x hip -std=c++17 --cuda-device-only -nogpulib -nogpuinc -O3 -ffp-contract=off \
//     --offload-arch=gfx1250 --no-gpu-bundle-output -I reference/hip ar_bias_rmsnorm.hip -o x.hsaco
#include "ref_common.h"

#pragma clang fp contract(off)  // the DSL never fuses a*b+c; neither may we (nvcc: --fmad=false)

namespace abr {
constexpr int BLOCK = 256, PACK = 8;

// dsl.block_sum, bit for bit: a butterfly (16, 8, 4, 2, 1) inside each 32-lane group, then
// the group partials added serially in group order
__device__ __forceinline__ float block_sum(float x, float* scratch) {
  for (int mask = 16; mask >= 1; mask >>= 1) x = x + ref_shfl_xor(x, mask);
  const int t = ref_thread_id();
  if ((t & 31) == 0) scratch[t >> 5] = x;
  __syncthreads();
  float total = scratch[0];
  for (int g = 1; g < BLOCK / 32; ++g) total = total + scratch[g];
  __syncthreads();  // the scratch is reused by the next row
  return total;
}

template <int H, int W>
__device__ __forceinline__ void body(const Peers<const hip_bfloat16>& inp, const hip_bfloat16* bias,
                                     const hip_bfloat16* residual, const hip_bfloat16* weight,
                                     hip_bfloat16* out, hip_bfloat16* residual_out,
                                     const Peers<int>& sig, int rank, int rows, float eps) {
  constexpr int PACKS = H / PACK, PER_THREAD = (PACKS + BLOCK - 1) / BLOCK;
  __shared__ float scratch[32];
  const int t = ref_thread_id();
  auto in_row = [&](int k) { return PACKS % BLOCK == 0 || t + k * BLOCK < PACKS; };
  // this rank's bias and weight, the same for every row: loaded before the start barrier
  F8 b[PER_THREAD], w[PER_THREAD];
  for (int k = 0; k < PER_THREAD; ++k) {
    if (!in_row(k)) continue;
    b[k] = unpack(((const gvec*)bias)[t + k * BLOCK]);
    w[k] = unpack(((const gvec*)weight)[t + k * BLOCK]);
  }
  SignalBarrier<W> signal(sig, rank);
  signal.start();  // every rank's input of this call is in place
  for (int row = ref_block_id(); row < rows; row += ref_num_blocks(BLOCK)) {
    F8 s[PER_THREAD];
    float sq = 0.0f;
    for (int k = 0; k < PER_THREAD; ++k) {
      if (!in_row(k)) continue;  // zeros add nothing to the sum of squares
      const int i = row * PACKS + t + k * BLOCK;
      F8 acc = unpack(((const gvec*)inp.p[0])[i]);  // from x_0: rank order on every rank
      for (int r = 1; r < W; ++r) {
        F8 x = unpack(((const gvec*)inp.p[r])[i]);
        for (int j = 0; j < PACK; ++j) acc.v[j] = acc.v[j] + x.v[j];
      }
      F8 res = unpack(((const gvec*)residual)[i]);
      for (int j = 0; j < PACK; ++j)
        s[k].v[j] = round_bf(round_bf(acc.v[j]) + b[k].v[j]) + res.v[j];
      ((gvec*)residual_out)[i] = pack_rne(s[k]);
      for (int j = 0; j < PACK; ++j) sq = sq + s[k].v[j] * s[k].v[j];
    }
    const float total = block_sum(sq, scratch);
    const float inv = 1.0f / __builtin_sqrtf(total / (float)H + eps);  // both correctly rounded
    for (int k = 0; k < PER_THREAD; ++k) {
      if (!in_row(k)) continue;
      F8 o;
      for (int j = 0; j < PACK; ++j) o.v[j] = (s[k].v[j] * inv) * w[k].v[j];
      ((gvec*)out)[row * PACKS + t + k * BLOCK] = pack_rne(o);
    }
  }
  signal.end();  // peers may now overwrite the inputs this block read
}
}  // namespace abr

// One extern "C" symbol per (H, W), as the DSL builds one kernel per constexpr variant:
// ar_bias_rmsnorm_bf16_h<H>_w<W>. Parameters in the DSL kernel's order; the peer tables
// (inp, sig) are passed by value.
#define ABR_KERNEL(H, W)                                                                      \
  extern "C" __global__ REF_LAUNCH_BOUNDS(256) void ar_bias_rmsnorm_bf16_h##H##_w##W(        \
      REF_GRID_CONST Peers<const hip_bfloat16> inp, const hip_bfloat16* bias,                \
      const hip_bfloat16* residual, const hip_bfloat16* weight, hip_bfloat16* out,           \
      hip_bfloat16* residual_out, REF_GRID_CONST Peers<int> sig, int rank, int rows,         \
      float eps) {                                                                           \
    abr::body<H, W>(inp, bias, residual, weight, out, residual_out, sig, rank, rows, eps);   \
  }
#define ABR_KERNEL_W(H) ABR_KERNEL(H, 2) ABR_KERNEL(H, 4) ABR_KERNEL(H, 8)
ABR_KERNEL_W(2880)
ABR_KERNEL_W(4096)
ABR_KERNEL_W(6144)
ABR_KERNEL_W(8192)
