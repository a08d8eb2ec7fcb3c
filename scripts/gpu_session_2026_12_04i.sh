#!/usr/bin/env bash
# H200 call H2 (2026-12-04, second session): where the small-row all-reduce time goes.
# 1. Before/after, twice interleaved: build_base/ (main at f4d1285) and build/ (the start
#    barrier's arrival relaxed where the kernel has written nothing), TP4 and TP2, H=6144,
#    1-256 rows, vLLM's all-reduce timed in every run (the drift reference).
# 2. One rank's one-stage kernel with its peers' arrivals written in advance (no waits, no
#    skew): its own time at 1/16/64 rows, alone and all ranks at once; Nsight Compute at 16.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
for round in 1 2; do
  for b in build_base build; do
    step "ab $b r$round" 120 env BENCH_ROWS="1 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $b --tp 4 2 --hidden 6144 --vllm-header peers_src --json $OUT/ab_${b}_r$round.json > $OUT/ab_${b}_r$round.log 2>&1
    grep "null collective" $OUT/ab_${b}_r$round.log
    grep -A12 "peers in the same run" $OUT/ab_${b}_r$round.log | grep "^| [0-9]" | cut -d'|' -f2-8
  done
done
for rows in 1 16 64; do
  for mode in "" "--all-ranks"; do
    step "one rank 1stage rows=$rows $mode" 60 env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build build --path 1stage --world 4 --rows $rows --unroll 2 --block 256 $mode 2>&1 | tail -3
  done
done
step "ncu 1stage 16 rows" 150 ncu --clock-control none -k regex:allreduce_ --launch-skip 2 --launch-count 1 --set full --import-source yes -o $OUT/ncu_ar1_16rows env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build build --path 1stage --world 4 --rows 16 --unroll 2 --block 256 --no-graph > $OUT/ncu_ar1_16rows.log 2>&1
ncu -i $OUT/ncu_ar1_16rows.ncu-rep --page details > $OUT/ncu_ar1_16rows_details.txt 2>&1
grep -E "Duration|Elapsed Cycles|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Stall|Block Limit|Memory Throughput" $OUT/ncu_ar1_16rows_details.txt | head -30
ncu -i $OUT/ncu_ar1_16rows.ncu-rep --page source --print-source sass --csv > $OUT/ncu_ar1_16rows_sass.csv 2>&1; head -c 600 $OUT/ncu_ar1_16rows_sass.csv
true
