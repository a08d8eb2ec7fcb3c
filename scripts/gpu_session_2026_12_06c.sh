#!/usr/bin/env bash
# Device call L3 (2026-12-06). Issue 15 item 2 at 64-256 rows, two dispatch questions the
# forced-path sweeps (J2 at 6144 and 2880, L2 at 8192) raised:
#  alt: at TP4 the two-stage kernel with V = 1 (U4V1E0S0) was at or ahead of the one-stage
#       kernel from 64 rows at H = 6144 and 8192, where dispatch takes the one-stage kernel
#       below 2 MiB and V = 2 at 6144: the two-stage kernel from 768 KiB with V = 1 (this
#       also moves H = 2880's 256-row call to its split two-stage kernel);
#  r1:  the one-stage kernel's two-rows-per-iteration form (dispatch's pick once rows
#       outnumber the blocks) was slower than the plain one in 9 of 10 TP4 cells at 64-256
#       rows: the plain one-stage kernel throughout (PEERDSL_FUSED_1STAGE_ROWS=1).
# Three sides twice interleaved in one call (now, alt, r1, now, alt, r1), the vLLM AR + Triton
# pair in every run; TP4 and TP2 (alt leaves TP2 as it is: a repeat of "now").
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l3; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l3.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for side in now alt r1; do
    case $side in
      now) envs="" ;;
      alt) envs="PEERDSL_FUSED_TWO_STAGE_MIN_BYTES=786432 PEERDSL_FUSED_ROWS=1" ;;
      r1) envs="PEERDSL_FUSED_1STAGE_ROWS=1" ;;
    esac
    step "$side r$round" 85 env $envs BENCH_ROWS="64 128 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 2 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/${side}_r$round.json > $W/${side}_r$round.log 2>&1
    tail -3 $W/${side}_r$round.log | grep -i error
    python3 scripts/fused_pairs_line.py $W/${side}_r$round.json
  done
done
true
