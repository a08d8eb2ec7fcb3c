#!/usr/bin/env bash
# Device call N7 (2026-12-07, second session): the A/B of call N6's change on this tree.
# "new" is its dispatch (TP2 LL up to 320 KiB), "old" the previous cap
# (PEERDSL_LL_MAX_BYTES=131072), twice interleaved, TP2, H = 2880 / 6144 / 8192, 16-32 rows,
# vLLM's all-reduce in every run. Carry build and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/n7; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/n7.tgz -C $W .; }
run() {  # name, extra env...
  local name=$1; shift
  step "$name" 60 env "$@" BENCH_ROWS="16 24 32" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/$name.json > $W/$name.log 2>&1
  grep -i -m3 "error\|no report" $W/$name.log | cut -c1-300
  python3 -c "
import json,sys
d=json.load(open('$W/$name.json'))['tp2']['rows']
print('$name', ' '.join('%s %s %.1f/%.1f' % (k, r['ar_path'], r['ar_us'], r['vllm_ar_us']) for k, r in d.items()))"
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do
  run new_r$r X=1
  run old_r$r PEERDSL_LL_MAX_BYTES=131072
done
true
