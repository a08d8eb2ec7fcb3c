#!/usr/bin/env bash
# Device call M4 (2026-12-07). Issue 15 items 1 and 2 on this tree's build, every hidden size
# the issue names (2880, 6144, 8192), TP4 and TP2, every row count: our all-reduce against
# vLLM's and our fused call against the vLLM AR + Triton pair, in the same rank processes.
# Twice, so each cell has two samples.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m4; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/m4.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  step "bench r$round" 270 env BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_m --tp 4 2 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/bench_r$round.json > $W/bench_r$round.log 2>&1
  grep -i -m3 "error\|no report" $W/bench_r$round.log | cut -c1-400
  python3 scripts/fused_pairs_line.py $W/bench_r$round.json
  python3 - $W/bench_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    print(tp, "AR ours/vLLM", " ".join("%s %s %.1f/%.1f" % (k, r["ar_path"], r["ar_us"], r["vllm_ar_us"])
                                        for k, r in d.get(tp, {}).get("rows", {}).items()))
PY
done
true
