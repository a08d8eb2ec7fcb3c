#!/usr/bin/env bash
# Device call Q4 (2026-12-07, fourth session). The final build (the one-stage kernel's W = 2
# runtime-H variants at MAXH 12288 and 16384 now predicated, as build_p8's were in Q3):
# bench_ar_rms at TP2 (the changed kernels' world), H = 10240, 12288, 16384, 256-2048 rows,
# the vLLM AR + Triton pair in the same processes; then the runtime proof on these kernels
# (Q1 ran the fault suite on kernels that differ from these only there).
# Carry build and peers_src.
W=/tmp/q4; TAG=q4; source scripts/session_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step "bench" 70 env BENCH_ROWS="256 1024 2048" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 10240 12288 16384 --vllm-header peers_src --json $W/bench.json > $W/bench.log 2>&1
grep -i -m3 "error\|no report" $W/bench.log | cut -c1-300
python3 scripts/fused_pairs_line.py $W/bench.json
step "collectives" 90 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
true
