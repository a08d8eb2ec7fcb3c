#!/usr/bin/env bash
# Device call M1 (2026-12-06). The norm-family thread mapping at H = 2880 (the lead of call
# L8): add_rmsnorm and the split path's gather kernel built with B threads per row and M
# blocks per SM (scripts/norm_block_probe_build.py, into build_probe), all four ranks'
# kernels at once, beside the Triton add + RMSNorm on the same bytes; two interleaved rounds
# at 4096, 1024 and 256 rows. Then Nsight Compute on one rank's add_rmsnorm for the current
# mapping (B=256 M=4) and B=384 M=4.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m1; mkdir -p $W; B=build_probe
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/device.txt
timeout 300 env PYTHONPATH=. python3 scripts/norm_block_probe_run.py --build $B --hidden 2880 \
  --rounds 2 2>&1 | tee $W/probe.txt | grep -v "^$"
for cx in "B=256 M=4" "B=384 M=4"; do
  tag=$(echo $cx | tr -d ' =')
  timeout 120 ncu --clock-control none -k regex:add_rmsnorm --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
    -o $W/n$tag env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --path norm \
    --world 4 --rows 4096 --hidden 2880 --no-graph --cx $cx > $W/ncu_$tag.log 2>&1
  ncu -i $W/n$tag.ncu-rep --page details > $W/ncu_${tag}_details.txt 2>&1
  echo "== $cx"; grep -E " Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit Reg|Warp Cycles Per Issued" $W/ncu_${tag}_details.txt | head -8
  rm -f $W/n$tag.ncu-rep
done
tar czf $OUT/m1.tgz -C $W .
