#!/usr/bin/env bash
# Device call M6 (2026-12-07). A second sample of call M5's sweep, with 6144 and 8192 beside
# 4096 and 7168 at 256-4096 rows, TP4 and TP2: M5 put the split two-stage kernel 10% ahead of
# dispatch's one-launch kernel at TP4 7168 x 4096 rows, and the one-stage rows kernel 14-24%
# ahead of dispatch's split kernel at TP2 4096 from 1024 rows (one sample each).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m6; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/m6.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step "sweep" 400 env BENCH_ROWS="256 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_m --tp 4 2 --hidden 4096 7168 6144 8192 --vllm-header peers_src --json $W/sweep.json > $W/sweep.log 2>&1
grep -i -m3 "error\|no report" $W/sweep.log | cut -c1-400
python3 scripts/sweep_best_line.py $W/sweep.json
true
