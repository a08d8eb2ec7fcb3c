#!/usr/bin/env bash
# Device call K1 (2026-12-05, fourth session). Where the cost of SPEC section 3's end barrier
# lies (issue 15 item 1 at 1-64 rows), and whether our one-stage kernel gets it back:
# (1) vLLM's one-stage kernel as is (s1), with SPEC's orderings at both barriers (s3) and the
# end only (s6), and with SPEC's orderings but the end arrival (the release) issued right after
# the last round's peer loads, before its output stores (s7): if the release's fence pays for
# draining the output writes, s7 runs near s1. In the same runs ours with the one-stage path
# forced (no LL, no two-stage), A/B twice interleaved: build_new (end barrier after the stores)
# and build_k (Signal.end_arrive before the last round's stores; in the fused one-stage
# kernel before the last row's norm and stores: the fused column). TP4 and TP2, H = 6144,
# 1-256 rows. (2) The fault suite and the runtime proof on build_k (the end protocol changed).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/k1; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/k1.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for build in build_new build_k; do
    step "stages $build r$round" 75 env PEERDSL_LL_MAX_BYTES=0 PEERDSL_TWO_STAGE_MIN_WORLD=99 BENCH_VLLM_SPEC=1 BENCH_ROWS="1 4 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $build --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/stages_${build}_r$round.json > $W/stages_${build}_r$round.log 2>&1
    tail -3 $W/stages_${build}_r$round.log | grep -i error
    python3 scripts/spec_stages_line.py $W/stages_${build}_r$round.json
  done
done
step "faults build_k" 110 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_k --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-200
step "collectives build_k" 80 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_k --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
true
