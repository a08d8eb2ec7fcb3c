#!/usr/bin/env bash
# Device call P3 (2026-12-07, third session). Hidden sizes past 8192 (runtime-H bounds MAXH
# 12288 and 16384), never timed: at TP4 dispatch sends them to the two-stage kernel from
# 768 KiB, with the default schedule (U0V1E1: their other schedules spilled), which is the
# slowest two-stage schedule at every size swept so far. Forced-path sweeps at H = 10240,
# 12288 and 16384, TP4 and TP2, 16-2048 rows, against the vLLM AR + Triton pair, twice.
# Carry build and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/p3; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/p3.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do
  step "sweep r$r" 240 env BENCH_ROWS="16 64 256 1024 2048" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 10240 12288 16384 --vllm-header peers_src --json $W/sweep_r$r.json > $W/sweep_r$r.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/sweep_r$r.log | cut -c1-300
  python3 scripts/sweep_best_line.py $W/sweep_r$r.json
done
true
