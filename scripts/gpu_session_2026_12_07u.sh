#!/usr/bin/env bash
# Device call Q3 (2026-12-07, fourth session). Would the fused one-stage kernel (TP2's path at
# every row count past H = 8192) gain from predicated reads too? build_p8 predicates every
# runtime-H slot of every kernel (PREDICATED_PER_THREAD = 8; its W = 2 one-stage kernels
# fit, 95-122 registers, no spill); build is the tree's (the one-stage kernel guarded there).
# A/B twice interleaved, bench_runtime_h at TP2, H = 10240, 12288, 16384, 256 and 2048 rows.
# Carry build, build_p8 and peers_src.
W=/tmp/q3; TAG=q3; source scripts/session_steps.sh
ab() {  # name, build
  step "$1" 60 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build $2 --tp 2 --hidden 10240 12288 16384 --rows 256 2048 --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|differ\|mismatch" $W/$1.log | cut -c1-300
  tail -7 $W/$1.log | cut -c1-200
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do ab base_r$r build; ab p8_r$r build_p8; done
true
