#!/usr/bin/env bash
# Device call M7 (2026-12-07). A/B of the split change (calls M5/M6), twice interleaved: "new"
# is this tree's dispatch at H = 4096 and 7168; "old" is the previous one, reproduced with
# PEERDSL_FUSED_SPLIT (=1 at 4096: split at TP2 and TP4; =0 at 7168: the one-launch kernel).
# TP4 and TP2, 256-4096 rows, the vLLM AR + Triton pair in every run.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m7; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/m7.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
run() {  # name, hidden, extra env...
  local name=$1 h=$2; shift 2
  step "$name" 120 env "$@" BENCH_ROWS="256 1024 2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_m --tp 4 2 --hidden $h --vllm-header peers_src --json $W/$name.json > $W/$name.log 2>&1
  grep -i -m3 "error\|no report" $W/$name.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$name.json
}
for r in 1 2; do
  run new_r$r "4096 7168" X=1
  run old4096_r$r 4096 PEERDSL_FUSED_SPLIT=1
  run old7168_r$r 7168 PEERDSL_FUSED_SPLIT=0
done
true
