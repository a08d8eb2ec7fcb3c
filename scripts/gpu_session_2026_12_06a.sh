#!/usr/bin/env bash
# Device call L1 (2026-12-06). Issue 15 items 1 and 2 at 1-256 rows: the staged one-stage
# kernels (ops/allreduce_staged.py, and in the fused column ops/fused_ar_rms_staged.py: one
# barrier, no end barrier) against our current dispatch (LL to 128 KiB, then the one-stage
# kernels with their end barrier) and vLLM's one-stage kernel as is (+ Triton add+RMSNorm),
# in the same runs, A/B twice interleaved (now, staged, now, staged), TP4 and TP2, H = 6144.
# Then the fault suite (new staged cases) and the runtime proof with the staged path on.
# Ran at f6e5db6; the staged kernels were removed after it (9aeaccd, RESULTS.md call L1), so
# this script is the record of that call, not runnable on later trees.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l1; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l1.tgz -C $W .; }
STAGED="PEERDSL_LL_MAX_BYTES=0 PEERDSL_STAGED_MAX_BYTES=4194304 PEERDSL_FUSED_STAGED_MAX_BYTES=4194304"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for side in now staged; do
    envs=""; [ $side = staged ] && envs=$STAGED
    step "$side r$round" 80 env $envs BENCH_ROWS="1 4 16 64 128 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_s --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/${side}_r$round.json > $W/${side}_r$round.log 2>&1
    tail -3 $W/${side}_r$round.log | grep -i error
    python3 - $W/${side}_r$round.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    s = d.get(tp, {})
    print(tp, "null %.1f" % s.get("null_us", 0))
    for k, r in s.get("rows", {}).items():
        print("  %5s: ours %.1f (%s) vllm %.1f | fused %.1f (%s) pair %.1f vllm+triton %.1f" % (
            k.split(":")[1], r["ar_us"], r["ar_path"], r["vllm_ar_us"], r["fused_us"],
            r["path"], r["pair_us"], r["vllm_pair_us"]))
PY
  done
done
step "faults" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_s --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-300
step "collectives staged" 80 env $STAGED PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_s --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-300
true
