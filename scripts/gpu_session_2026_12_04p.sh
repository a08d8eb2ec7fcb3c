#!/usr/bin/env bash
# H200 call I2 (2026-12-04, third session): the runtime proof on this commit's kernels (the
# Signal's poll and start changed), host cost of eager calls (item 3) at TP4 under MPS and
# at TP1 without MPS, each also after an idle GPU with the CPU kept busy, and two more
# small-row samples of ours beside vLLM's one-stage kernel with SPEC's barriers (stages 3-6).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/i2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "collectives" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 30 --replays 100 --json $W/collectives.json > $W/collectives.log 2>&1
tail -4 $W/collectives.log | cut -c1-240
step "faults" 120 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-240
step "host tp4" 120 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 4 --json $W/host_tp4.json > $W/host_tp4.log 2>&1
tail -20 $W/host_tp4.log
step "host tp1" 80 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 1 --json $W/host_tp1.json > $W/host_tp1.log 2>&1
tail -20 $W/host_tp1.log
for round in 3 4; do
  step "small r$round" 60 env BENCH_VLLM_SPEC=1 BENCH_ROWS="1 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/small_r$round.json > $W/small_r$round.log 2>&1
  python3 - $W/small_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    for k, r in d.get(tp, {}).get("rows", {}).items():
        print(tp, k, " ".join("%s %.1f" % (n, r[n]) for n in (
            "ar_us", "vllm_ar1_us", "vllm_ar3_us", "vllm_ar4_us", "vllm_ar5_us", "vllm_ar6_us",
            "fused_us", "vllm_pair_us")), all(r["vllm_ar%d_equal" % s] for s in (3, 4, 5, 6)))
PY
done
rm -f $W/*.png
tar czf $OUT/i2.tgz -C $W .
true
