#!/usr/bin/env bash
# Device call M3 (2026-12-07). The forced-path sweep at H = 2880 on the 384-threads-a-row build
# (call M2's sweep stopped on a bench bug, fixed in 15d0cfe): does dispatch still pick the
# fastest path at every row count, TP4 and TP2? Twice, so every cell has two samples, with the
# vLLM AR + Triton pair in each run.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m3; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; tar czf $OUT/m3.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  step "sweep r$round" 240 env BENCH_ROWS="64 128 256 384 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_m --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/sweep_r$round.json > $W/sweep_r$round.log 2>&1
  grep -i -m3 "error\|no report" $W/sweep_r$round.log | cut -c1-400
  python3 scripts/fused_pairs_line.py $W/sweep_r$round.json
  python3 scripts/sweep_best_line.py $W/sweep_r$round.json
done
true
