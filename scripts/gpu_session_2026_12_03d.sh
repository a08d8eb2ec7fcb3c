#!/usr/bin/env bash
# H200 call B1 (2026-12-03, second session): before/after benchmark in one run (base =
# c11e453 with its own runtime from base_src/, build_base/; new = this commit, build/), the
# host cost of plain and prepared calls, and issue 14's fault cases. $OUT: 8 files at most.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; J=/tmp/jobs; mkdir -p $J
nvidia-smi -L
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "bench base" 170 bash -c "cd base_src && PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build ../build_base --tp 2 4 --hidden 6144 --json $OUT/bench_base.json 2>&1 | tail -45"
step "bench new" 170 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 4 --hidden 6144 --json $OUT/bench_new.json 2>&1 | tail -45
step "host cost" 100 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --host-cost --json $OUT/host_cost.json 2>&1 | tail -30
step "faults" 120 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $OUT/faults.json 2>&1 | grep -v "^ " | tail -6
true
