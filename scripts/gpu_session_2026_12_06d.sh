#!/usr/bin/env bash
# Device call L4 (2026-12-06). The tree's sm_90 fused dispatch after call L3 (the two-stage
# kernel from 768 KiB at TP4 with V = 1 up to 256 rows; the one-stage rows kernel at TP2
# only), measured against the vLLM AR + Triton pair at every row count of issue 15 item 2,
# TP4 and TP2, H = 2880, 6144 and 8192, twice; then the runtime proof (every collective and
# the fused entry exact against the reference, eager and graph-replayed) on that dispatch.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l4; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l4.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  step "item 2 r$round" 170 env BENCH_ROWS="1 4 16 64 128 256 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 2 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/item2_r$round.json > $W/item2_r$round.log 2>&1
  tail -3 $W/item2_r$round.log | grep -i error
  python3 scripts/fused_pairs_line.py $W/item2_r$round.json
done
step "collectives" 120 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-300
true
