#!/usr/bin/env bash
# Device call Q5 (2026-12-07, fourth session). The fused one-stage kernel at W = 4, MAXH 12288
# (TP4's path below that bound's 4 MiB floor) fits predicated reads too (115 / 126 registers,
# no spill; at MAXH 16384 it spilled). build_p8 has it predicated, build (the tree's) guarded;
# nothing else they run here differs. A/B twice interleaved, bench_runtime_h at TP4,
# H = 10240 and 12288, 64 and 128 rows. Carry build, build_p8 and peers_src.
W=/tmp/q5; TAG=q5; source scripts/session_steps.sh
ab() {  # name, build
  step "$1" 40 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build $2 --tp 4 --hidden 10240 12288 --rows 64 128 --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|differ\|mismatch" $W/$1.log | cut -c1-300
  tail -4 $W/$1.log | cut -c1-200
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do ab base_r$r build; ab p8_r$r build_p8; done
true
