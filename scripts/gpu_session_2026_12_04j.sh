#!/usr/bin/env bash
# H200 call H3 (2026-12-04, second session): the side-by-side table at H = 2880 and 8192 (H1
# had 6144) with the relaxed start arrival, TP4 and TP2; then Nsight Compute's warp-stall
# samples per SASS line of one rank's one-stage all-reduce at 16 rows (peers' arrivals
# written in advance: benchmarks/ncu_ar_one_rank.py). Few files come back: no plots.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TAG=${TAG:-h3}; HIDDEN=${HIDDEN:-"2880 8192"}
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
for tp in 4 2; do
  step "bench tp$tp" 200 env BENCH_SWEEP=0 BENCH_SINGLE_GPU=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp $tp --hidden $HIDDEN --vllm-header peers_src --json $OUT/bench_${TAG}_tp$tp.json > $OUT/bench_${TAG}_tp$tp.log 2>&1
  grep "null collective" $OUT/bench_${TAG}_tp$tp.log
  grep -A30 "peers in the same run" $OUT/bench_${TAG}_tp$tp.log | grep "^| [0-9]"
done
rm -f $OUT/*.png
W=/tmp/ncu; mkdir -p $W
step "ncu 1stage 16 rows" 150 ncu --clock-control none -k regex:allreduce_ --launch-skip 2 --launch-count 1 --set full --import-source yes -o $W/ar1 env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build build --path 1stage --world 4 --rows 16 --unroll 2 --block 256 --no-graph > $W/ar1.log 2>&1
tail -3 $W/ar1.log
ncu -i $W/ar1.ncu-rep --page details > $OUT/ncu_ar1_16rows_${TAG}_details.txt 2>&1
ncu -i $W/ar1.ncu-rep --page source --print-source sass --csv > $W/sass.csv 2>&1
python3 scripts/ncu_top_stalls.py $W/sass.csv 30 | tee $OUT/ncu_ar1_16rows_${TAG}_stalls.txt
grep -E "Duration|Warp Cycles Per Issued|Achieved Occupancy" $OUT/ncu_ar1_16rows_${TAG}_details.txt | head
rm -f $OUT/libvllm_ar.so
true
