#!/usr/bin/env bash
# H200 call H8 (2026-12-04, second session): main (37ac384 kernels) at 1-256 rows, H = 6144,
# TP4 and TP2, twice, vLLM in every run: more samples of the small-row ratios (item 1).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/h8; mkdir -p $W
for round in 1 2; do
  timeout 100 env BENCH_ROWS="1 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/small_r$round.json > $W/small_r$round.log 2>&1
  python3 - $W/small_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    s = d.get(tp, {})
    print(tp, "null %.1f" % s.get("null_us", 0), " ".join(
        "%s: ar %.1f vllm %.1f (%.2f) fused %.1f pair %.1f (%.2f)" % (
            k.split(":")[1], r["ar_us"], r["vllm_ar_us"], r["vllm_ar_us"] / r["ar_us"],
            r["fused_us"], r["vllm_pair_us"], r["vllm_pair_us"] / r["fused_us"])
        for k, r in s.get("rows", {}).items()))
PY
done
rm -f $W/*.png
tar czf $OUT/h8.tgz -C $W .
true
