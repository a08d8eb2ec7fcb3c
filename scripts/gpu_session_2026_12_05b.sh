#!/usr/bin/env bash
# H200 call J2 (2026-12-05). (1) The fault suite on the LL kernel whose failed wait now names
# the line of another call before a line that is merely late (J1: at TP4 a skip was reported
# as CollectiveTimeout by a rank that saw the mismatch while a third rank's line had not
# landed). (2) The runtime proof on the same kernels, the LL and fused-LL ranges at 1 MiB.
# (3) The fused paths forced, twice interleaved, TP4 and TP2, H = 6144 and 2880, 64-1024
# rows, against the same run's vLLM AR + Triton pair: which path dispatch should take where.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/j2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/j2.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step "faults" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -2 $W/faults.log | cut -c1-300
step "collectives" 90 env PEERDSL_LL_MAX_BYTES=1048576 PEERDSL_FUSED_LL_MAX_BYTES=1048576 PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -2 $W/collectives.log | cut -c1-200
for round in 1 2; do
  step "sweep r$round" 120 env BENCH_ROWS="64 128 256 1024" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 2 --hidden 6144 2880 --vllm-header peers_src --json $W/sweep_r$round.json > $W/sweep_r$round.log 2>&1
  python3 scripts/fused_pairs_line.py $W/sweep_r$round.json
done
true
