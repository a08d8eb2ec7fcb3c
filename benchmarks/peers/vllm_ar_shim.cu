// C entry points over vLLM's custom all-reduce kernels, so benchmarks/peer_vllm.py can time
// them in the same rank processes, graphs and run as ours (issue 15: "measured side by side
// in one run"). The kernels and their Signal protocol are vLLM's, from the header FlashInfer
// vendors (include/flashinfer/comm/vllm_custom_all_reduce.cuh, "adapted from vllm v0.8.2");
// that header is not part of this repository: scripts/peer_sources.sh copies it into
// peers_src/ (git-ignored) and the benchmark builds this file on the GPU machine with
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -I peers_src \
//        benchmarks/peers/vllm_ar_shim.cu -lcuda -o libvllm_ar.so
//
// Every entry returns a cudaError_t (0: success) or a negative code of its own.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "vllm_custom_all_reduce.cuh"

namespace {

constexpr int kNotRegistered = -2;
constexpr int kBadWorld = -3;
constexpr int kBadSize = -4;

// vLLM's one-stage kernel with the barrier orderings SPEC section 3 asks of ours (issue 15
// item 1: is the small-row gap the SPEC's fences or our code?). Same counters, slots, grid and
// data loop as vllm::cross_device_reduce_1stage; only the barriers differ:
//   SPEC: start arrival a system-scope store, acquire polls compared wrap-safely (>=);
//         end arrival a release store, acquire polls (vLLM: volatile both, no fence).
//   OURS: SPEC plus what our Signal adds around it: polls bounded by a spin limit that also
//         load the rank's error word (relaxed, issued before each acquire).
// Stage 3 launches SPEC, stage 4 OURS, 7 SPEC with the end arrival early (below); 5 and 6 take SPEC's orderings at one barrier only
// (5: the start, 6: the end; the other as vLLM's), to say which barrier costs what.
// (The compare is wrap-safe everywhere.)
__device__ unsigned g_error_word = 0;
__device__ int g_spin_limit = 1 << 30;

template <bool fenced>
__device__ __forceinline__ void poll(unsigned& seen, unsigned* slot) {
  if (fenced) {
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(seen) : "l"(slot));
  } else {
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(seen) : "l"(slot));
  }
}

template <int ngpus, bool is_start, bool ours, bool fenced>
__device__ __forceinline__ void spec_barrier(const vllm::RankSignals& sg, vllm::Signal* self_sg,
                                             int rank, int limit) {
  if (!is_start) __syncthreads();  // a start that releases nothing needs none (signal.py)
  if (threadIdx.x < ngpus) {
    auto val = self_sg->self_counter[blockIdx.x][threadIdx.x] += 1;
    auto* peer_slot = &sg.signals[threadIdx.x]->peer_counter[val % 2][blockIdx.x][rank];
    auto* self_slot = &self_sg->peer_counter[val % 2][blockIdx.x][threadIdx.x];
    if (!fenced) {
      asm volatile("st.volatile.global.u32 [%1], %0;" ::"r"(val), "l"(peer_slot));
    } else if (is_start) {
      asm volatile("st.relaxed.sys.global.u32 [%1], %0;" ::"r"(val), "l"(peer_slot));
    } else {
      asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(val), "l"(peer_slot));
    }
    unsigned seen, stop = 0;
    int n = 0;
    poll<fenced>(seen, self_slot);
    while (static_cast<int>(seen - val) < 0 && (!ours || (n < limit && stop == 0))) {
      if (ours) {  // before the acquire, as signal.py _wait_slot: both loads in flight at once
        asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(stop) : "l"(&g_error_word));
        ++n;
      }
      poll<fenced>(seen, self_slot);
    }
    if (ours && static_cast<int>(seen - val) < 0) atomicCAS(&g_error_word, 0u, 1u);
  }
  __syncthreads();
}

template <typename T, int ngpus, bool ours, bool start_fenced, bool end_fenced>
__global__ void __launch_bounds__(512, 1)
    spec_reduce_1stage(vllm::RankData* _dp, vllm::RankSignals sg, vllm::Signal* self_sg,
                       T* __restrict__ result, int rank, int size) {
  using P = typename vllm::packed_t<T>::P;
  using A = typename vllm::packed_t<T>::A;
  const int limit = ours ? *static_cast<volatile int*>(&g_spin_limit) : 0;
  auto dp = *_dp;
  spec_barrier<ngpus, true, ours, start_fenced>(sg, self_sg, rank, limit);
  for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < size; idx += gridDim.x * blockDim.x) {
    ((P*)result)[idx] = vllm::packed_reduce<P, ngpus, A>((const P**)&dp.ptrs[0], idx);
  }
  spec_barrier<ngpus, false, ours, end_fenced>(sg, self_sg, rank, limit);
}

// Stage 7: SPEC's orderings at both barriers, but the end arrival (the release) right after
// the last round's peer loads and before its stores: the release must order this rank's reads
// of the peers' inputs before the arrival, not its own output stores, so the fence no longer
// waits for the output writes to drain (is that what SPEC's end barrier costs, issue 15
// item 1?). The wait stays after the stores.
template <int ngpus>
__device__ __forceinline__ unsigned spec_end_arrive(const vllm::RankSignals& sg,
                                                    vllm::Signal* self_sg, int rank) {
  __syncthreads();  // every thread's peer loads have returned (their values are in registers)
  unsigned val = 0;
  if (threadIdx.x < ngpus) {
    val = self_sg->self_counter[blockIdx.x][threadIdx.x] += 1;
    auto* peer_slot = &sg.signals[threadIdx.x]->peer_counter[val % 2][blockIdx.x][rank];
    asm volatile("st.release.sys.global.u32 [%1], %0;" ::"r"(val), "l"(peer_slot));
  }
  return val;
}

template <int ngpus>
__device__ __forceinline__ void spec_end_wait(vllm::Signal* self_sg, unsigned val) {
  if (threadIdx.x < ngpus) {
    auto* self_slot = &self_sg->peer_counter[val % 2][blockIdx.x][threadIdx.x];
    unsigned seen;
    poll<true>(seen, self_slot);
    while (static_cast<int>(seen - val) < 0) poll<true>(seen, self_slot);
  }
  __syncthreads();
}

template <typename T, int ngpus>
__global__ void __launch_bounds__(512, 1)
    spec_reduce_1stage_early_end(vllm::RankData* _dp, vllm::RankSignals sg,
                                 vllm::Signal* self_sg, T* __restrict__ result, int rank,
                                 int size) {
  using P = typename vllm::packed_t<T>::P;
  using A = typename vllm::packed_t<T>::A;
  auto dp = *_dp;
  spec_barrier<ngpus, true, false, true>(sg, self_sg, rank, 0);
  const int stride = gridDim.x * blockDim.x;
  const int last = ((size - 1) / stride) * stride;  // the last round's first index
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  for (; idx < last; idx += stride)
    ((P*)result)[idx] = vllm::packed_reduce<P, ngpus, A>((const P**)&dp.ptrs[0], idx);
  idx = last + blockIdx.x * blockDim.x + threadIdx.x;
  P v;
  if (idx < size) v = vllm::packed_reduce<P, ngpus, A>((const P**)&dp.ptrs[0], idx);
  const unsigned val = spec_end_arrive<ngpus>(sg, self_sg, rank);
  if (idx < size) ((P*)result)[idx] = v;
  spec_end_wait<ngpus>(self_sg, val);
}

template <int W>
void launch(vllm::CustomAllreduce* ar, vllm::RankData* ptrs, nv_bfloat16* out, int packs,
            int stage, int blocks, int threads, cudaStream_t stream) {
  if (stage == 1) {
    vllm::cross_device_reduce_1stage<nv_bfloat16, W>
        <<<blocks, threads, 0, stream>>>(ptrs, ar->sg_, ar->self_sg_, out, ar->rank_, packs);
  } else if (stage == 7) {
    spec_reduce_1stage_early_end<nv_bfloat16, W>
        <<<blocks, threads, 0, stream>>>(ptrs, ar->sg_, ar->self_sg_, out, ar->rank_, packs);
  } else if (stage >= 3) {
    auto kernel = stage == 3   ? spec_reduce_1stage<nv_bfloat16, W, false, true, true>
                  : stage == 4 ? spec_reduce_1stage<nv_bfloat16, W, true, true, true>
                  : stage == 5 ? spec_reduce_1stage<nv_bfloat16, W, false, true, false>
                               : spec_reduce_1stage<nv_bfloat16, W, false, false, true>;
    kernel<<<blocks, threads, 0, stream>>>(ptrs, ar->sg_, ar->self_sg_, out, ar->rank_, packs);
  } else {
    vllm::cross_device_reduce_2stage<nv_bfloat16, W>
        <<<blocks, threads, 0, stream>>>(ptrs, ar->sg_, ar->self_sg_, out, ar->rank_, packs);
  }
}

}  // namespace

extern "C" {

int vllm_ar_handle_bytes() { return sizeof(cudaIpcMemHandle_t); }

int vllm_ar_signal_bytes() { return sizeof(vllm::Signal); }

int vllm_ar_max_blocks() { return vllm::kMaxBlocks; }

// A zeroed device allocation of `bytes` and its IPC handle (vllm_ar_handle_bytes() bytes).
int vllm_ar_alloc(size_t bytes, void** ptr, void* handle) {
  cudaError_t e = cudaMalloc(ptr, bytes);
  if (e != cudaSuccess) return e;
  e = cudaMemset(*ptr, 0, bytes);
  if (e != cudaSuccess) return e;
  e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return e;
  return cudaIpcGetMemHandle(static_cast<cudaIpcMemHandle_t*>(handle), *ptr);
}

int vllm_ar_open(const void* handle, void** ptr) {
  return cudaIpcOpenMemHandle(ptr, *static_cast<const cudaIpcMemHandle_t*>(handle),
                              cudaIpcMemLazyEnablePeerAccess);
}

// signals[r]: rank r's Signal (followed by its two-stage scratch), opened in this process.
void* vllm_ar_create(void** signals, void* rank_data, size_t rank_data_bytes, int rank,
                     int world) {
  return new vllm::CustomAllreduce(reinterpret_cast<vllm::Signal**>(signals), rank_data,
                                   rank_data_bytes, rank, world);
}

// ptrs[r]: rank r's input buffer, opened in this process (ptrs[rank] is this rank's own).
int vllm_ar_register(void* ar, void** ptrs) {
  try {
    static_cast<vllm::CustomAllreduce*>(ar)->register_buffer(ptrs);
  } catch (...) {
    return -1;
  }
  return 0;
}

// bf16 all-reduce of `numel` elements of the registered `input` into `output` on `stream`.
// stage 1 or 2 forces that kernel (3-6: the one-stage kernel with SPEC's / our barriers, above); 0 takes vLLM's own choice (CustomAllreduce::allreduce's
// rule, restated here because that method asks a capturing stream for graph registration).
int vllm_ar_bf16(void* ar_handle, void* input, void* output, long numel, int stage,
                 int block_limit, int threads, void* stream) {
  auto* ar = static_cast<vllm::CustomAllreduce*>(ar_handle);
  auto it = ar->buffers_.find(input);
  if (it == ar->buffers_.end()) return kNotRegistered;
  if (numel % 8 != 0 || block_limit < 1 || block_limit > vllm::kMaxBlocks) return kBadSize;
  if (stage < 0 || stage > 7) return kBadSize;
  const int packs = static_cast<int>(numel / 8);
  const long bytes = numel * 2;
  const int world = ar->world_size_;
  if (stage == 0) {
    const bool one = world == 2 || (world <= 4 && bytes < 512 * 1024) ||
                     (world <= 8 && bytes < 256 * 1024);
    stage = one ? 1 : 2;
  }
  const int blocks = std::min(block_limit, (packs + threads - 1) / threads);
  auto* out = static_cast<nv_bfloat16*>(output);
  auto s = static_cast<cudaStream_t>(stream);
  switch (world) {
    case 2: launch<2>(ar, it->second, out, packs, stage, blocks, threads, s); break;
    case 4: launch<4>(ar, it->second, out, packs, stage, blocks, threads, s); break;
    case 8: launch<8>(ar, it->second, out, packs, stage, blocks, threads, s); break;
    default: return kBadWorld;
  }
  return cudaGetLastError();
}

void vllm_ar_destroy(void* ar) { delete static_cast<vllm::CustomAllreduce*>(ar); }

}  // extern "C"
