#!/usr/bin/env bash
# Device call R1 (2026-12-07, fifth session). The fused one-stage runtime-H kernel at W = 4,
# MAXH 12288 now predicates its 6 slots' reads (build_r1; 115 / 126 registers, no spill), as
# W = 2 does since call Q3; build is the previous tree's (guarded there). TP4 dispatch takes
# that kernel below 4 MiB, where the vLLM AR + Triton pair led (10240 x 128 rows: 33.0 us
# against 31.2). A/B twice interleaved (bench_runtime_h, TP4, H = 10240 and 12288); then the
# forced-path sweep on build_r1 from 64 to 1024 rows (one-stage against split, the pair
# beside them: where the 4 MiB floor should sit) and the runtime proof on build_r1.
# Carry build, build_r1 and peers_src.
W=/tmp/r1; TAG=r1; source scripts/session_steps.sh
ab() {  # name, build
  step "$1" 90 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build $2 --tp 4 --hidden 10240 12288 --rows 64 256 1024 --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|differ\|mismatch" $W/$1.log | cut -c1-300
  tail -7 $W/$1.log | cut -c1-200
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do ab base_r$r build; ab new_r$r build_r1; done
step "sweep" 150 env BENCH_ROWS="64 128 256 512 1024" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_r1 --tp 4 --hidden 10240 12288 --vllm-header peers_src --json $W/sweep.json > $W/sweep.log 2>&1
grep -i -m3 "error\|no report\|mismatch" $W/sweep.log | cut -c1-300
python3 scripts/sweep_best_line.py $W/sweep.json
step "collectives" 90 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_r1 --tp 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
true
