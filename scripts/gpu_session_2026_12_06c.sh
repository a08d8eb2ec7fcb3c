#!/usr/bin/env bash
# Device call L3 (2026-12-06). Issue 15 item 2 at TP4, 64-256 rows: the forced-path sweeps
# (J2 at 6144 and 2880, L2 at 8192) put the two-stage kernel with V = 1 (U4V1E0S0) at or
# ahead of the one-stage kernel from 64 rows at H = 6144 and 8192, where dispatch takes the
# one-stage kernel below 2 MiB and V = 2 at 6144. A/B twice interleaved in one call: "now"
# (the tree's dispatch) and "alt" (the two-stage kernel from 768 KiB, V = 1), against the vLLM
# AR + Triton pair in every run. H = 2880 is in the run because the alt threshold moves its
# 256-row call to the two-stage kernel too. TP2 is not affected (two-stage from 4 ranks).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l3; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l3.tgz -C $W .; }
ALT="PEERDSL_FUSED_TWO_STAGE_MIN_BYTES=786432 PEERDSL_FUSED_ROWS=1"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for side in now alt; do
    envs=""; [ $side = alt ] && envs=$ALT
    step "$side r$round" 110 env $envs BENCH_ROWS="64 128 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/${side}_r$round.json > $W/${side}_r$round.log 2>&1
    tail -3 $W/${side}_r$round.log | grep -i error
    python3 scripts/fused_pairs_line.py $W/${side}_r$round.json
  done
done
true
