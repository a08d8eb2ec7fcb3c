#!/usr/bin/env bash
# Device call L2 (2026-12-06). (1) Where the fused one-stage kernel's time goes at TP4, H =
# 6144, 16-128 rows (issue 15 item 2: it trails vLLM AR + Triton there by about our
# all-reduce's gap plus 1-2 us): one rank's kernel alone and all four ranks at once, the
# barrier arrivals written in advance (benchmarks/ncu_ar_one_rank.py), beside the one-stage
# all-reduce the same way; Nsight Compute on both at 64 rows. (2) Item 2 at H = 8192 (and 2880)
# with dispatch's choices and every valid fused path (BENCH_SWEEP=1), TP4 and TP2.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l2.tgz -C $W .; }
B=build_new
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
one() { PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --world 4 --hidden 6144 "$@" 2>&1 | tail -1; }
step "one-rank timings" 150 bash -c "$(declare -f one); B=$B; for rows in 16 64 128; do for all in '' --all-ranks; do one --path 1stage --rows \$rows --unroll 4 --block 256 \$all; one --path fused1 --rows \$rows \$all; done; done" | tee $W/one_rank.txt
for p in 1stage fused1; do
  extra=""; [ $p = 1stage ] && extra="--unroll 4 --block 256"
  step "ncu $p 64 rows" 120 ncu --clock-control none -k regex:allreduce_\|fused_ar --launch-skip 2 --launch-count 1 --set full --import-source yes -o $W/$p env PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build $B --path $p --world 4 --rows 64 --hidden 6144 $extra --no-graph > $W/$p.log 2>&1
  tail -2 $W/$p.log
  ncu -i $W/$p.ncu-rep --page details > $W/ncu_${p}_64rows_details.txt 2>&1
  ncu -i $W/$p.ncu-rep --page source --print-source sass --csv > $W/sass_$p.csv 2>&1
  python3 scripts/ncu_top_stalls.py $W/sass_$p.csv 25 > $W/ncu_${p}_64rows_stalls.txt; head -14 $W/ncu_${p}_64rows_stalls.txt
  grep -E " Duration|Warp Cycles Per Issued|Achieved Occupancy|DRAM Throughput|Registers Per|Block Limit Reg" $W/ncu_${p}_64rows_details.txt | head -8
  rm -f $W/$p.ncu-rep $W/sass_$p.csv
done
step "sweep 8192" 280 env BENCH_ROWS="64 256 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $B --tp 4 2 --hidden 8192 --vllm-header peers_src --json $W/sweep.json > $W/sweep.log 2>&1
python3 scripts/fused_pairs_line.py $W/sweep.json
true
