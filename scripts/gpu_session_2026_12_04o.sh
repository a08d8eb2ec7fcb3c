#!/usr/bin/env bash
# H200 call I1 (2026-12-04, third session): the poll loop loading the error word before the
# acquire (one round trip per poll, not two) and no block barrier before a start arrival
# that releases nothing, A/B twice interleaved: build_base/ (338b6e6 kernels) and build/
# (this commit), TP4 and TP2, H = 6144, 1-256 rows; vLLM's one-stage kernel also with SPEC
# section 3's barriers (stage 3) and ours (stage 4) in every run (BENCH_VLLM_SPEC=1).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/i1; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for b in build_base build; do
    step "ab $b r$round" 115 env BENCH_VLLM_SPEC=1 BENCH_ROWS="1 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $b --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/ab_${b}_r$round.json > $W/ab_${b}_r$round.log 2>&1
    python3 - $W/ab_${b}_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    s = d.get(tp, {})
    print(tp, "null %.1f" % s.get("null_us", 0))
    for k, r in s.get("rows", {}).items():
        print("  %s: ar %.1f vllm1 %.1f (%.2f) spec3 %s ours4 %s eq %s/%s fused %.1f pair %.1f" % (
            k.split(":")[1], r["ar_us"], r["vllm_ar1_us"], r["vllm_ar1_us"] / r["ar_us"],
            r.get("vllm_ar3_us"), r.get("vllm_ar4_us"), r.get("vllm_ar3_equal"),
            r.get("vllm_ar4_equal"), r["fused_us"], r.get("vllm_pair_us", 0)))
PY
  done
done
rm -f $W/*.png
tar czf $OUT/i1.tgz -C $W .
true
