#!/usr/bin/env bash
# Device call P2 (2026-12-07, third session). The fused entry's two-stage floor at hidden
# sizes the runtime-H kernels serve (dispatch.py fused_two_stage_min_bytes_runtime_h, TP4):
# call P1 found the one-stage kernel ahead of the two-stage one at H = 2048 x 256 rows and
# H = 5120 x 128-512 rows. Forced-path sweeps around each bound's floor, twice: MAXH 2048
# (H = 2048, 256-512 rows), 4096 (3584, 256-512), 6144 (5120, 1024-2048) and 8192 (7680,
# 64-2048, not yet measured). Dispatch's column is this tree's rule. Carry build, peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/p2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/p2.tgz -C $W .; }
sweep() {  # name, rows, hidden...
  local name=$1 rows=$2; shift 2
  step "$name" 150 env BENCH_ROWS="$rows" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden "$@" --vllm-header peers_src --json $W/$name.json > $W/$name.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/$name.log | cut -c1-300
  python3 scripts/sweep_best_line.py $W/$name.json
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do
  sweep small_r$r "256 384 512" 2048 3584
  sweep h5120_r$r "1024 2048" 5120
  sweep h7680_r$r "64 128 256 512 1024 2048" 7680
done
true
