#!/usr/bin/env bash
# Device call M5 (2026-12-07). (1) The forced-path sweep at H = 4096 and 7168, TP4 and TP2:
# their dispatch thresholds are interpolated from 2880 and 6144/8192 and were never measured;
# does dispatch pick the fastest path there? (2) The tutorial's user kernel at H = 2880 with
# its variants now asking for 2 blocks per SM at 384 threads (M = 2): fused == its unfused
# chain on the GPU, and its time.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m5; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/m5.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step "sweep" 300 env BENCH_ROWS="64 256 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_m --tp 4 2 --hidden 4096 7168 --vllm-header peers_src --json $W/sweep.json > $W/sweep.log 2>&1
grep -i -m3 "error\|no report" $W/sweep.log | cut -c1-400
python3 scripts/fused_pairs_line.py $W/sweep.json
python3 scripts/sweep_best_line.py $W/sweep.json
step "example" 150 env PYTHONPATH=. python3 examples/ar_bias_rmsnorm/run_gpu.py --build build_m --tp 2 4 --hidden 2880 --rows 1 64 1024 4096 --json $W/example.json > $W/example.log 2>&1
tail -8 $W/example.log | cut -c1-300
true
