#!/usr/bin/env bash
# H200 call H4 (2026-12-04, second session): before/after of the norm kernels' blocks per SM
# (_row_slots.norm_min_blocks) at H = 2880 and 4096, twice interleaved: build_base/ (ebd0081)
# and build/ (this commit), TP4 and TP2, with the Triton norm and vLLM in every run; then
# runtime-H at 2880 on the new build. Everything under $W, tarred into one file.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/h4; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
for round in 1 2; do
  for b in build_base build; do
    step "ab $b r$round" 150 env BENCH_ROWS="64 256 1024 2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $b --tp 4 2 --hidden 2880 4096 --vllm-header peers_src --json $W/ab_${b}_r$round.json > $W/ab_${b}_r$round.log 2>&1
    python3 - $W/ab_${b}_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    for k, r in d.get(tp, {}).get("rows", {}).items():
        print(tp, k, r["path"], "rms %.1f triton %.1f fused %.1f vllm_pair %.1f pair %.1f" % (
            r["rms_us"], r["triton_us"], r["fused_us"], r["vllm_pair_us"], r["pair_us"]))
PY
  done
done
step "runtime-H 2880" 120 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 2880 --rows 1024 4096 --json $W/runtime_h.json > $W/runtime_h.log 2>&1
tail -12 $W/runtime_h.log
rm -f $W/*.png
tar czf $OUT/h4.tgz -C $W .
true
