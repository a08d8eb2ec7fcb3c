#!/usr/bin/env bash
# H200 call I2 (2026-12-04, fourth session): the runtime proof on this commit's kernels (the
# Signal's poll and start changed; the fused one-stage kernel with two rows per block
# iteration), then that kernel against the plain one (PEERDSL_FUSED_1STAGE_ROWS=1), twice
# interleaved, TP4 and TP2, H = 6144 and 2880, 16-1024 rows, vLLM + Triton in every run.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/i2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "collectives" 170 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 20 --replays 60 --json $W/collectives.json > $W/collectives.log 2>&1
tail -4 $W/collectives.log | cut -c1-240
for round in 1 2; do
  for v in 1 0; do
    rows_env=""; [ $v = 1 ] && rows_env="PEERDSL_FUSED_1STAGE_ROWS=1"  # 0: dispatch's choice
    step "rows V=$v r$round" 100 env $rows_env BENCH_ROWS="16 64 128 256 1024" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 6144 2880 --vllm-header peers_src --json $W/rows_v${v}_r$round.json > $W/rows_v${v}_r$round.log 2>&1
    python3 scripts/fused_pairs_line.py $W/rows_v${v}_r$round.json
  done
done
rm -f $W/*.png
tar czf $OUT/i2.tgz -C $W .
true
