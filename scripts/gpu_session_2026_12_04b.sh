#!/usr/bin/env bash
# H200 call G3 (2026-12-04): the gather kernel beside add + RMSNorm in one process (same
# bytes), timed and under Nsight Compute, at H = 2880 (where it ran 1.3x slower in G2) and 6144.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
for H in 2880 6144; do
  PYTHONPATH=. timeout 60 python3 benchmarks/ncu_gather_vs_norm.py --build build --hidden $H --world 4
done
PYTHONPATH=. timeout 60 python3 benchmarks/ncu_gather_vs_norm.py --build build --hidden 2880 --world 2
NCU="ncu --clock-control none -k regex:gather|add_rmsnorm --launch-skip 2 --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SourceCounters"
PYTHONPATH=. timeout 200 $NCU python3 benchmarks/ncu_gather_vs_norm.py --build build --hidden 2880 --world 4 --no-graph > $OUT/ncu_gather_2880.txt 2>&1
grep -E "fused_ar_rms_gather|add_rmsnorm|Duration|DRAM Throughput|Memory Throughput|L2 Hit|L1/TEX Hit|Achieved Occupancy|Registers Per|Theoretical Occ|Stall|Sectors/Req|Uncoalesced|Excessive|Mem Busy|Max Bandwidth|Block Limit" $OUT/ncu_gather_2880.txt | head -90
