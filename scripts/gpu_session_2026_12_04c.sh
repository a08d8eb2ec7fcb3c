#!/usr/bin/env bash
# H200 call G4 (2026-12-04): the gather kernel at 3 blocks per SM (min_blocks) beside
# add + RMSNorm, then the split fused call's parts, then every fused path forced at TP4 and
# TP2 (H = 2880, 6144) with the split schedule in the sweep.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
for W in 4 2; do
  PYTHONPATH=. timeout 60 python3 benchmarks/ncu_gather_vs_norm.py --build build --hidden 2880 --world $W
done
step "parts" 200 env PYTHONPATH=. python3 benchmarks/bench_fused_parts.py --build build --tp 4 2 --hidden 2880 6144 --rows 1024 2048 4096 --json $OUT/bench_fused_parts_g4.json
step "bench tp4" 300 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 --json $OUT/bench_g4_tp4.json > $OUT/bench_g4_tp4.log 2>&1
grep "^|\|^TP" $OUT/bench_g4_tp4.log | tail -24
step "bench tp2" 200 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 2880 6144 --json $OUT/bench_g4_tp2.json > $OUT/bench_g4_tp2.log 2>&1
grep "^|\|^TP" $OUT/bench_g4_tp2.log | tail -24
true
