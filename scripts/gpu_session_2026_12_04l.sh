#!/usr/bin/env bash
# H200 call H5 (2026-12-04, second session), main at the merge of the runtime-H predicated
# reads and the gfx1250 epilogue change (both change sm_90 kernels): the runtime proof
# (specialized and PEERDSL_FORCE_RUNTIME_H=1), runtime-H against the specialized kernels,
# and the side-by-side table at H = 6144 and 2880 with vLLM and Triton. One tar file back.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/h5; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "collectives" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 30 --replays 100 --json $W/collectives.json > $W/collectives.log 2>&1
tail -4 $W/collectives.log
step "collectives runtime-H" 150 env PEERDSL_FORCE_RUNTIME_H=1 PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 10 --replays 30 --json $W/collectives_rth.json > $W/collectives_rth.log 2>&1
tail -4 $W/collectives_rth.log
step "runtime-H" 150 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 2880 5120 6144 8192 --rows 16 1024 4096 --json $W/runtime_h.json > $W/runtime_h.log 2>&1
tail -16 $W/runtime_h.log
step "bench" 150 env BENCH_SWEEP=0 BENCH_SINGLE_GPU=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 6144 2880 --vllm-header peers_src --json $W/bench.json > $W/bench.log 2>&1
grep "null collective" $W/bench.log
grep -A40 "peers in the same run" $W/bench.log | grep "^| [0-9]"
rm -f $W/*.png
tar czf $OUT/h5.tgz -C $W .
true
