#!/usr/bin/env bash
# Device call R4 (2026-12-07, fifth session). R3's streamed split path (build_r3) was 4-14%
# faster at TP4 2880 x 1024-2048 rows but 1-3% slower at 4096 rows in two rounds, within
# what the pair moved between runs. Three more rounds interleaved at 2048 and 4096 rows,
# TP4 and TP2 (TP2 2880 runs the split path too), the pair in every run.
# Carry build_r1, build_r3 and peers_src.
W=/tmp/r4; TAG=r4; source scripts/session_steps.sh
ab() {  # name, build
  step "$1" 120 env BENCH_ROWS="2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2 3; do ab base_r$r build_r1; ab new_r$r build_r3; done
true
