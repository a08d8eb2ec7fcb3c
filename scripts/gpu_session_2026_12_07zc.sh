#!/usr/bin/env bash
# Device call S2 (2026-12-07, sixth session). Issue 15 item 5 on the final build: every
# runtime-H row kernel against the specialized one at the same H, TP4 and TP2. The last
# such run (H5, 2026-12-04) predates the 384-thread mapping at 2880, the split path, the
# predicated slots and the streamed accesses. Carry build and peers_src.
W=/tmp/s2; TAG=s2; source scripts/session_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for tp in 4 2; do
  step "runtime-H tp$tp" 170 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp $tp --hidden 2880 4096 6144 7168 8192 --rows 16 1024 4096 --json $W/runtime_h_tp$tp.json > $W/runtime_h_tp$tp.log 2>&1
  grep -i -m3 "error\|no report\|differ" $W/runtime_h_tp$tp.log | cut -c1-300
  tail -40 $W/runtime_h_tp$tp.log
done
true
