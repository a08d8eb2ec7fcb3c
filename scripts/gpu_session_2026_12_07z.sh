#!/usr/bin/env bash
# Device call R5 (2026-12-07, fifth session). The final build (R3's build_r3 kernels: the
# streamed split path, and R1's predicated one-stage kernel at W = 4, MAXH 12288) with the
# final dispatch: issue 15 items 1 and 2 in one bench_ar_rms run (H = 2880, 6144, 8192, TP4
# and TP2, vLLM's AR and the pair in the same processes), then the fault suite on these
# kernels (R3 ran the runtime proof on them). Carry build and peers_src.
W=/tmp/r5; TAG=r5; source scripts/session_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
bench_items 1 build
step "faults" 110 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-200
true
