#!/usr/bin/env bash
# Device call N4 (2026-12-07, second session). Call N3 found the one-launch two-stage kernel's
# gather phase starved at H = 2880: one 384-thread block a rank per SM, and one pack a thread
# a row, so V = 2 rows keep 4 loads in flight a thread, where the split path's gather kernel
# has ~5 blocks an SM. This build adds the schedules V = 4 and 6 rows (U x W <= 8 at 2 blocks
# an SM: U2 at TP4, U4 at TP2) where a thread holds one pack a row (2880, and MAXH 2048).
# Two forced-path sweeps at 2880, one at 2048, TP4 and TP2. Carry build and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/n4; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/n4.tgz -C $W .; }
sweep() {  # name, hidden, rows
  step "$1" 200 env BENCH_ROWS="$3" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden $2 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/sweep_best_line.py $W/$1.json | cut -c1-700
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
sweep s2880_r1 2880 "256 1024 2048 4096"
sweep s2048_r1 2048 "256 1024 4096"
sweep s2880_r2 2880 "256 1024 2048 4096"
true
