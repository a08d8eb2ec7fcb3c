#!/usr/bin/env bash
# H200 call J1 (2026-12-05): which SPEC barrier costs what (vLLM's one-stage kernel with SPEC's
# orderings at both barriers, the start only, the end only: shim stages 3, 5, 6; ours beside
# it), TP4 and TP2, H = 6144, 1-256 rows; host cost of eager calls (item 3) at TP4 under MPS
# and TP1 without, each also after an idle GPU with the CPU kept busy; the fused one-stage
# rows kernel at H = 2880 with V = 4 / 2 / 1; the fault suite on the current kernels.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/j1; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/j1.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step "spec stages" 130 env BENCH_VLLM_SPEC=1 BENCH_ROWS="1 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/spec.json > $W/spec.log 2>&1
python3 - $W/spec.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    s = d.get(tp, {})
    print(tp, "null %.1f" % s.get("null_us", 0))
    for k, r in s.get("rows", {}).items():
        print("  %s: ours %.1f (%s) | vllm as-is %.1f spec-both %s spec-start %s spec-end %s ours-barriers %s | eq %s%s%s%s" % (
            k.split(":")[1], r["ar_us"], r["ar_path"], r["vllm_ar1_us"], r.get("vllm_ar3_us"),
            r.get("vllm_ar5_us"), r.get("vllm_ar6_us"), r.get("vllm_ar4_us"),
            r.get("vllm_ar3_equal"), r.get("vllm_ar4_equal"), r.get("vllm_ar5_equal"), r.get("vllm_ar6_equal")))
PY
step "host tp4" 120 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 4 --json $W/host_tp4.json > $W/host_tp4.log 2>&1
tail -14 $W/host_tp4.log
step "host tp1" 70 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 1 --json $W/host_tp1.json > $W/host_tp1.log 2>&1
tail -14 $W/host_tp1.log
for v in 4 2 1; do
  step "rows V=$v" 60 env PEERDSL_FUSED_1STAGE_ROWS=$v BENCH_ROWS="64 128 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 --vllm-header peers_src --json $W/rows_v$v.json > $W/rows_v$v.log 2>&1
  python3 scripts/fused_pairs_line.py $W/rows_v$v.json
done
step "faults" 110 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-200
true
