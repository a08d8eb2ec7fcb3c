#!/usr/bin/env bash
# H200 calls H1.. (2026-12-04, second session): our all-reduce and fused entry beside vLLM's
# custom all-reduce and the vLLM + Triton add + RMSNorm pair, in the same rank processes and
# run (bench_ar_rms.py --vllm-header; scripts/peer_sources.sh fills peers_src/, carried with
# build/). TAG names the call's files, TPS and HIDDEN choose the sizes.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-h1}; TPS=${TPS:-"4 2"}; HIDDEN=${HIDDEN:-"6144 2880"}; LIMIT=${LIMIT:-270}
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
cat peers_src/SOURCES; nvcc --version | tail -1
for tp in $TPS; do
  step "bench tp$tp" $LIMIT env BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp $tp --hidden $HIDDEN --vllm-header peers_src --json $OUT/bench_${TAG}_tp$tp.json > $OUT/bench_${TAG}_tp$tp.log 2>&1
  grep -q "^| [0-9]" $OUT/bench_${TAG}_tp$tp.log || tail -40 $OUT/bench_${TAG}_tp$tp.log
  grep -A40 "peers in the same run" $OUT/bench_${TAG}_tp$tp.log | grep "^| [0-9]"
done
true
