#!/usr/bin/env bash
# Device call P1 (2026-12-07, third session). Issue 15 items 1 and 2 on the final tree's
# build (2d29098: TP2's LL range to 320 KiB), every hidden size the issue names, TP4 and TP2,
# every row count, vLLM's all-reduce and the vLLM AR + Triton pair in the same rank
# processes, twice; between the two, a forced-path sweep at the two runtime-H cells left as
# leads (TP4 H = 2048 and 5120 around 256 rows). Carry build and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/p1; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/p1.tgz -C $W .; }
bench() {
  step "bench r$1" 240 env BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/bench_r$1.json > $W/bench_r$1.log 2>&1
  grep -i -m3 "error\|no report" $W/bench_r$1.log | cut -c1-400
  python3 scripts/fused_pairs_line.py $W/bench_r$1.json
  python3 - $W/bench_r$1.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    print(tp, "AR ours/vLLM", " ".join("%s %s %.1f/%.1f" % (k, r["ar_path"], r["ar_us"], r["vllm_ar_us"])
                                        for k, r in d.get(tp, {}).get("rows", {}).items()))
PY
}
sweep() {
  step "sweep r$1" 150 env BENCH_ROWS="128 256 512" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2048 5120 --vllm-header peers_src --json $W/sweep_r$1.json > $W/sweep_r$1.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/sweep_r$1.log | cut -c1-300
  python3 scripts/sweep_best_line.py $W/sweep_r$1.json
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
bench 1; sweep 1; bench 2; sweep 2
true
