#!/usr/bin/env bash
# Device call N3 (2026-12-07, second session). Where TP4 H = 2880's fused time goes past the
# bytes (the cell at item 2's 1.2 edge): the split path's first launch (stage 1: the column
# shards reduced into each rank's staging, between two barriers) with the peers' arrivals
# written in advance (`ncu_ar_one_rank.py --path stage1`), one rank alone and all four at once,
# at the communicator's grid (33 blocks a rank on an H100) and at 66 and 16; the gather and
# Triton's norm beside it; Nsight Compute on one rank's stage 1; and the real fused call under
# MPS (bench_ar_rms) in the same call, so real minus (stage 1 + gather) is what the barriers,
# the skew and the launches cost. Carry build and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/n3; mkdir -p $W; B=build
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; tar czf $OUT/n3.tgz -C $W .; }
one() { timeout 60 env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --world 4 --hidden 2880 "$@" 2>&1 | tail -1 | tee -a $W/probe.txt; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for rows in 4096 1024; do
  for round in 1 2; do
    one --path stage1 --rows $rows
    one --path stage1 --rows $rows --all-ranks
    one --path stage1 --rows $rows --all-ranks --grid 66
    one --path stage1 --rows $rows --all-ranks --grid 16
    one --path gather --rows $rows --all-ranks
    one --path triton --rows $rows --all-ranks
  done
done
step "ncu stage1" 150 ncu --clock-control none -k regex:fused_ar_rms_2stage --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --section SourceCounters -o $W/stage1 env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --path stage1 --world 4 --rows 4096 --hidden 2880 --no-graph > $W/ncu_stage1.log 2>&1
ncu -i $W/stage1.ncu-rep --page details > $W/ncu_stage1_details.txt 2>&1
grep -E " Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|L2 Hit|Grid Size|Block Size" $W/ncu_stage1_details.txt | head -16
ncu -i $W/stage1.ncu-rep --page source --print-source sass --csv > $W/stage1_sass.csv 2>/dev/null && python3 scripts/ncu_top_stalls.py $W/stage1_sass.csv 12 | cut -c1-160
rm -f $W/stage1.ncu-rep
step "bench" 90 env BENCH_ROWS="1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $B --tp 4 --hidden 2880 --vllm-header peers_src --json $W/bench.json > $W/bench.log 2>&1
python3 scripts/fused_pairs_line.py $W/bench.json
true
