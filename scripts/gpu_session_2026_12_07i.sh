#!/usr/bin/env bash
# Device call N2 (2026-12-07, second session). The runtime-H kernels' split rule
# (runtime/kernel_variants.py split_max_bound: bounds MAXH <= 4096 run the two-stage kernel
# split), not re-measured since call G5, when the specialized 4096 still split too. Two
# forced-path sweeps (every fused path and schedule the build holds, bytes checked against
# the unfused path) at sizes that are not specialized: H = 2048 (MAXH 2048), 3584 (4096) and
# 5120 (Qwen3-32B, 6144), TP4 and TP2, 256-4096 rows. Carry build and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/n2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/n2.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do
  step "sweep r$r" 240 env BENCH_ROWS="256 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 2048 3584 5120 --vllm-header peers_src --json $W/sweep_r$r.json > $W/sweep_r$r.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/sweep_r$r.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/sweep_r$r.json
  python3 scripts/sweep_best_line.py $W/sweep_r$r.json
done
true
