#!/usr/bin/env bash
# H200 call F2 (2026-12-03, third session): dispatch after call F1 (fused two-stage from
# 2 MiB at TP4 with U=4, V=2), TP4 at H = 2880, 6144, 8192 without the forced sweep; TP2 at
# 6144 with it (the schedules forced at TP2 too).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "bench tp4" 240 env BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 8192 --json $OUT/bench_f2_tp4.json 2>&1 | sed -n '/^TP4/,/^$/p' | head -30
step "bench tp2" 200 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 6144 --json $OUT/bench_f2_tp2.json 2>&1 | grep "^|\|^TP" | head -30
true
