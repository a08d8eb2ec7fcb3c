#!/usr/bin/env bash
# One H200 call (2026-12-03, second session): issue 14's fault cases on the GPU, the shipped
# proofs with the new Signal protocol (call tags, wrap-safe epochs), and the before/after
# benchmark (build_base = c11e453, before the fault work and the gfx1250 code changes;
# build = this commit).
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; J=/tmp/jobs; mkdir -p $J  # $OUT returns 8 files at most
nvidia-smi -L
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "faults" 200 python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $J/faults.json 2>&1 | tail -30 | tee $J/faults.log
step "gpu_collectives" 200 python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 30 --replays 200 --json $J/collectives.json 2>&1 | tail -30 | tee $J/collectives.log
step "compare shipped" 60 python3 -m peerdsl.cli compare fused_ar_rms_1stage --arch sm_90 --run --build build 2>&1 | tail -30 | tee $J/compare.log
step "compare user op" 60 python3 -m peerdsl.cli compare ar_bias_rmsnorm --ref examples/ar_bias_rmsnorm/ar_bias_rmsnorm.hip --arch sm_90 --constexpr T=bf16 --constexpr H=6144 --constexpr W=4 --run --inputs examples/ar_bias_rmsnorm/inputs.py:compare_case --build build --module examples/ar_bias_rmsnorm/ar_bias_rmsnorm.py 2>&1 | tail -30 | tee -a $J/compare.log
step "example run_gpu" 150 python3 examples/ar_bias_rmsnorm/run_gpu.py --build build --tp 2 4 --rows 16 1024 4096 --json $J/example.json 2>&1 | tail -20 | tee $J/example.log
step "bench base" 200 python3 benchmarks/bench_ar_rms.py --build build_base --tp 2 4 --hidden 6144 --json $OUT/bench_base.json 2>&1 | tail -40 | tee $J/bench_base.log
step "bench new" 200 python3 benchmarks/bench_ar_rms.py --build build --tp 2 4 --hidden 6144 --json $OUT/bench_new.json 2>&1 | tail -40 | tee $J/bench_new.log
cat $J/*.log > $OUT/session.log; cp $J/faults.json $J/collectives.json $J/example.json $OUT/ 2>/dev/null; true
