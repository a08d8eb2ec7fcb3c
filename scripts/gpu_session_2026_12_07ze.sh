#!/usr/bin/env bash
# Device call S4 (2026-12-07, sixth session): what the budget left after twelve refused
# starts allows, item 5 alone: the runtime-H kernels against the specialized ones at TP4,
# H = 2880 / 6144 / 8192. Carry build.
W=/tmp/s4; TAG=s4; source scripts/session_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step "runtime-H tp4" 140 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 2880 6144 8192 --rows 16 1024 4096 --json $W/runtime_h_tp4.json > $W/runtime_h_tp4.log 2>&1
grep -i -m3 "error\|no report\|differ" $W/runtime_h_tp4.log | cut -c1-300
tail -25 $W/runtime_h_tp4.log
true
