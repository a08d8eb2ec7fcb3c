#!/usr/bin/env bash
# H200 call G7 (2026-12-04): dispatch's own choice after `fused_unfused` (the fused entry takes
# the unfused pair where every fused path measured slower), TP4 and TP2, H 2880, 6144, 8192.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-g7}  # the call's name in the output files
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "bench tp4" 200 env BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 8192 --json $OUT/bench_${TAG}_tp4.json > $OUT/bench_${TAG}_tp4.log 2>&1
grep "^| [0-9]" $OUT/bench_${TAG}_tp4.log | head -24
step "bench tp2" 150 env BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 2880 6144 8192 --json $OUT/bench_${TAG}_tp2.json > $OUT/bench_${TAG}_tp2.log 2>&1
grep "^| [0-9]" $OUT/bench_${TAG}_tp2.log | head -24
true
