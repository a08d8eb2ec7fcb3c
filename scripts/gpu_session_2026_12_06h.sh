#!/usr/bin/env bash
# Device call L8 (2026-12-06). Where the fused entry's time goes at TP4, H = 2880 x 4096
# rows, the one cell from 1024 rows under item 2's 1.2 goal (1.11-1.13 in L4; the split
# two-stage path: stage 1, then the gather launch). benchmarks/ncu_ar_one_rank.py --path
# gather runs the gather kernel alone with every rank's staging filled as stage 1 leaves it;
# --path norm runs add_rmsnorm on the all-reduced rows, the same bytes from one buffer. Each
# for one rank and for all four at once (the HBM traffic of four ranks, no waits), then
# Nsight Compute on one rank's gather and norm kernels.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l8; mkdir -p $W; B=build_new
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; tar czf $OUT/l8.tgz -C $W .; }
one() { PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --world 4 --hidden 2880 --rows 4096 "$@" 2>&1 | tail -1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for p in gather norm; do
  one --path $p | tee -a $W/one_rank.txt
  one --path $p --all-ranks | tee -a $W/one_rank.txt
done
for p in gather norm; do
  step "ncu $p" 120 ncu --clock-control none -k regex:fused_ar_rms_gather\|add_rmsnorm --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats -o $W/$p env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --path $p --world 4 --rows 4096 --hidden 2880 --no-graph > $W/ncu_$p.log 2>&1
  ncu -i $W/$p.ncu-rep --page details > $W/ncu_${p}_details.txt 2>&1
  grep -E " Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|L2 Hit" $W/ncu_${p}_details.txt | head -14
  rm -f $W/$p.ncu-rep
done
true
