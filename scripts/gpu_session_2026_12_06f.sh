#!/usr/bin/env bash
# Device call L6 (2026-12-06). Issue 15 item 1 at 2048-4096 rows, TP4: in call L5 (H100) the
# one-stage all-reduce (U auto, B 256) took 171.4 us at H = 6144 x 4096 rows against 191.7
# for dispatch's two-stage kernel (from 32 MiB) and vLLM's 179.1; on the H200 of 2026-12-03
# they tied (144.4 / 142.0). A/B twice interleaved: "now" and "one" (the one-stage kernel up
# to the 64 MiB custom all-reduce cap: PEERDSL_TWO_STAGE_MIN_BYTES above it), vLLM beside.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l6; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l6.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for side in now one; do
    envs=""; [ $side = one ] && envs="PEERDSL_TWO_STAGE_MIN_BYTES=134217728"
    step "$side r$round" 80 env $envs BENCH_ROWS="2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 --hidden 6144 8192 --vllm-header peers_src --json $W/${side}_r$round.json > $W/${side}_r$round.log 2>&1
    tail -3 $W/${side}_r$round.log | grep -i error
    python3 - $W/${side}_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(" ".join("%s %s %.1f/vllm %.1f" % (k, r["ar_path"], r["ar_us"], r["vllm_ar_us"])
               for k, r in d["tp4"]["rows"].items()))
PY
  done
done
true
