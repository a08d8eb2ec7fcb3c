#!/usr/bin/env bash
# Device call P2 (2026-12-07, third session). The fused entry's two-stage floor at hidden
# sizes the runtime-H kernels serve (dispatch.py fused_two_stage_min_bytes_runtime_h, TP4):
# call P1 found the one-stage kernel ahead of the two-stage one at H = 2048 x 256 rows and
# H = 5120 x 128-512 rows. Forced-path sweeps around each bound's floor, twice: MAXH 2048
# (H = 2048, 256-512 rows), 4096 (3584, 256-512), 6144 (5120, 1024-2048) and 8192 (7680,
# 64-2048, not yet measured). Dispatch's column is this tree's rule. Then item 1 at TP4
# from 16 rows, as call N6 did at TP2: default dispatch (the one-stage kernel past sm_90's
# 128 KiB LL cap, with SPEC section 3's end-barrier release) against PEERDSL_LL_MAX_BYTES=1 MiB
# (LL at every size here), twice interleaved, vLLM's all-reduce in every run.
# Carry build, peers_src.
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
ll() {  # name, extra env...
  local name=$1; shift
  step "$name" 90 env "$@" BENCH_ROWS="8 16 24 32 48" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/$name.json > $W/$name.log 2>&1
  grep -i -m3 "error\|no report" $W/$name.log | cut -c1-300
  python3 -c "
import json
d=json.load(open('$W/$name.json'))['tp4']['rows']
print('$name', ' '.join('%s %s %.1f/%.1f' % (k, r['ar_path'], r['ar_us'], r['vllm_ar_us']) for k, r in d.items()))"
}
for r in 1 2; do
  sweep small_r$r "256 384 512" 2048 3584
  sweep h5120_r$r "1024 2048" 5120
  sweep h7680_r$r "64 128 256 512 1024 2048" 7680
done
for r in 1 2; do
  ll default_r$r X=1
  ll ll_r$r PEERDSL_LL_MAX_BYTES=1048576
done
true
