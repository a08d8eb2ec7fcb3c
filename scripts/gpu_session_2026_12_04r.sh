#!/usr/bin/env bash
# H200 call I3 (2026-12-04, fourth session): the fused one-stage kernel with four rows per
# iteration at H = 2880 against two and one (PEERDSL_FUSED_1STAGE_ROWS=1), twice interleaved,
# TP4 and TP2, vLLM + Triton in every run; the runtime proof (short) and the fault suite on
# these kernels; host cost of eager calls (item 3) at TP4 under MPS and at TP1 without MPS,
# each also after an idle GPU with the CPU kept busy.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/i3; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; tar czf $OUT/i3.tgz -C $W .; }
for round in 1 2; do
  for v in 1 2 0; do
    rows_env=""; [ $v != 0 ] && rows_env="PEERDSL_FUSED_1STAGE_ROWS=$v"  # 0: dispatch's choice
    step "rows V=$v r$round" 60 env $rows_env BENCH_ROWS="64 128 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/rows_v${v}_r$round.json > $W/rows_v${v}_r$round.log 2>&1
    python3 scripts/fused_pairs_line.py $W/rows_v${v}_r$round.json
  done
done
step "collectives" 90 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -4 $W/collectives.log | cut -c1-160
step "faults" 120 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-200
step "host tp4" 110 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 4 --json $W/host_tp4.json > $W/host_tp4.log 2>&1
tail -16 $W/host_tp4.log
step "host tp1" 70 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 1 --json $W/host_tp1.json > $W/host_tp1.log 2>&1
tail -16 $W/host_tp1.log
rm -f $W/*.png
tar czf $OUT/i3.tgz -C $W .
true
