#!/usr/bin/env bash
# Device call R6 (2026-12-07, fifth session). TP2 2880 at 256 rows is the one cell of item 2
# past 64 rows where the fused entry does not lead the pair (R5: 9.8 us against 8.9; earlier
# sweeps 8.8-9.2 against 8.8-9.2). It runs the one-stage rows kernel at V = 2 rows per block
# iteration (FUSED_1STAGE_ROWS); V = 4 is built for H = 2880 but was never timed on a GPU.
# Twice interleaved, V forced to 1, 2 and 4 (PEERDSL_FUSED_1STAGE_ROWS), TP2 H = 2880, 64-384
# rows, the pair in every run; then the forced-path sweep with V = 4 (each path's bytes
# against the unfused path's).
# Carry build and peers_src.
W=/tmp/r6; TAG=r6; source scripts/session_steps.sh
run_v() {  # name, V
  step "$1" 60 env PEERDSL_FUSED_1STAGE_ROWS=$2 BENCH_ROWS="64 128 256 384" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 2880 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do for v in 1 2 4; do run_v v${v}_r$r $v; done; done
step "sweep_v4" 60 env PEERDSL_FUSED_1STAGE_ROWS=4 BENCH_ROWS="128 256 384" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 2880 --vllm-header peers_src --json $W/sweep_v4.json > $W/sweep_v4.log 2>&1
grep -i -m3 "error\|no report\|mismatch" $W/sweep_v4.log | cut -c1-300
python3 scripts/sweep_best_line.py $W/sweep_v4.json
true
