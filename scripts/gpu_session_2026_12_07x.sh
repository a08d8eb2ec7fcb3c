#!/usr/bin/env bash
# Device call R3 (2026-12-07, fifth session). Streamed accesses on the split fused path
# (build_r3): stage 1 alone (S = 1) reads the inputs with ld.global.cs and the gather kernel
# reads the residual and writes residual_out with ld/st.global.cs (dsl.streaming), so the
# peers' reduced shards, which all four ranks' gathers read, may stay in L2. build_r1 is the
# same tree without them. A/B twice interleaved, TP4: H = 2880 (item 2's edge cell, the split
# path from 1024 rows) and 16384 (runtime-H, split from 768 KiB), the pair in every run.
# Then, on build_r3 with this tree's dispatch (the one-stage floor at MAXH 12288 moved to
# 26 MiB after R1/R2), TP4 H = 10240 and 12288 against the pair, and the runtime proof.
# Carry build_r1, build_r3 and peers_src.
W=/tmp/r3; TAG=r3; source scripts/session_steps.sh
ab() {  # name, build, hidden, rows
  step "$1" 100 env BENCH_ROWS="$4" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 --hidden $3 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do
  ab base2880_r$r build_r1 2880 "1024 2048 4096"
  ab new2880_r$r build_r3 2880 "1024 2048 4096"
done
for r in 1 2; do
  ab base16k_r$r build_r1 16384 "256 1024"
  ab new16k_r$r build_r3 16384 "256 1024"
done
ab dispatch12k build_r3 "10240 12288" "256 1024"
step "collectives" 90 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_r3 --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
true
