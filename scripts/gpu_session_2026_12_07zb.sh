#!/usr/bin/env bash
# Device call R7 (2026-12-07, fifth session). Which half of the streamed split path gives
# R3/R4's gain at TP4 2880 x 2048 rows, and which costs the 1% at 4096? build (final: stage 1's
# inputs and the gather's residual / residual_out streamed) against build_g (the gather's
# only; stage 1 as in build_r1). Two rounds interleaved, TP4 H = 2880, the pair in every run.
# Carry build, build_g and peers_src.
W=/tmp/r7; TAG=r7; source scripts/session_steps.sh
ab() {  # name, build
  step "$1" 80 env BENCH_ROWS="2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 --hidden 2880 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do ab both_r$r build; ab gather_r$r build_g; done
true
