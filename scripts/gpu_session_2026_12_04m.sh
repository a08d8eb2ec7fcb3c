#!/usr/bin/env bash
# H200 call H7 (2026-12-04, second session; ran on branch defer, cbb14fc, not merged): the one-stage all-reduce storing
# its last sums after the end barrier's arrival (D = 1, Signal.arrive_end / wait_end), twice
# interleaved: build_base/ (37ac384) and build/ (this commit), TP4 and TP2, H = 6144, 1-256
# rows, vLLM's all-reduce in every run; then the runtime proof on the new build.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/h7; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
for round in 1 2; do
  for b in build_base build; do
    step "ab $b r$round" 120 env BENCH_ROWS="1 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $b --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/ab_${b}_r$round.json > $W/ab_${b}_r$round.log 2>&1
    python3 - $W/ab_${b}_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    s = d.get(tp, {})
    print(tp, "null %.1f" % s.get("null_us", 0), " ".join(
        "%s: ar %.1f vllm %.1f (%.2f) fused %.1f" % (k.split(":")[1], r["ar_us"], r["vllm_ar1_us"],
                                                   r["vllm_ar1_us"] / r["ar_us"], r["fused_us"])
        for k, r in s.get("rows", {}).items()))
PY
  done
done
step "collectives" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 30 --replays 100 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-220
rm -f $W/*.png
tar czf $OUT/h7.tgz -C $W .
true
