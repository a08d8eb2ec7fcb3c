#!/usr/bin/env bash
# H200 call B2 (2026-12-03, second session): runtime-H kernels on the GPU (proof forced,
# then timed against the specialized ones), the shipped fused kernel against its HIP
# reference with sm_90's R=4 rows, and a second TP2 before/after run (small-row spread).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; J=/tmp/jobs; mkdir -p $J
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "collectives runtime-H forced" 120 env PEERDSL_FORCE_RUNTIME_H=1 PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 30 --replays 100 --json $OUT/collectives_runtime_h.json 2>&1 | grep -v "^ " | tail -4
step "compare shipped" 60 env PYTHONPATH=. python3 -m peerdsl.cli compare fused_ar_rms_1stage --arch sm_90 --run --build build 2>&1 | tail -4
step "runtime-H bench" 170 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 5120 6144 8192 --rows 16 1024 4096 --json $OUT/bench_runtime_h.json 2>&1 | tail -40
step "bench base tp2" 90 bash -c "cd base_src && PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build ../build_base --tp 2 --hidden 6144 --json $OUT/bench_base_tp2.json 2>&1 | tail -3"
step "bench new tp2" 90 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 6144 --json $OUT/bench_new_tp2.json 2>&1 | tail -3
true
