#!/usr/bin/env bash
# H200 call F1 (2026-12-03, third session): the fused two-stage schedules (U, V, E) against
# the one-stage kernel, every fused path forced, TP4 at H = 2880, 6144, 8192; then the
# runtime-H kernels (clamped reads up to MAXH 8192) against the specialized ones.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
step "bench tp4" 330 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 8192 --json $OUT/bench_f1_tp4.json 2>&1 | tail -62
step "runtime-H bench" 200 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 5120 6144 8192 --rows 16 1024 4096 --json $OUT/bench_runtime_h.json 2>&1 | tail -40
true
