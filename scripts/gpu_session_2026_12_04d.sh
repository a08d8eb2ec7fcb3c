#!/usr/bin/env bash
# H200 call G5 (2026-12-04): dispatch's own choice with the split schedule (TP4 and TP2,
# H = 2880, 6144, 8192, no forced sweep), runtime-H against specialized, and the collectives
# proof (every fused path dispatch takes, split included, checked bitwise).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-g5}  # the call's name in the output files (call G6 reran this with TAG=g6)
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "bench tp4" 200 env BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 8192 --json $OUT/bench_${TAG}_tp4.json > $OUT/bench_${TAG}_tp4.log 2>&1
grep "^|\|^TP" $OUT/bench_${TAG}_tp4.log | head -30
step "bench tp2" 150 env BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 2880 6144 8192 --json $OUT/bench_${TAG}_tp2.json > $OUT/bench_${TAG}_tp2.log 2>&1
grep "^|\|^TP" $OUT/bench_${TAG}_tp2.log | head -30
step "runtime-H bench" 200 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 2880 5120 6144 8192 --rows 16 1024 4096 --json $OUT/bench_runtime_h_$TAG.json > $OUT/runtime_h_$TAG.log 2>&1
tail -16 $OUT/runtime_h_$TAG.log
step "collectives" 200 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --steps 30 --replays 100 --json $OUT/gpu_collectives_$TAG.json > $OUT/gpu_collectives_$TAG.log 2>&1
tail -12 $OUT/gpu_collectives_$TAG.log
true
