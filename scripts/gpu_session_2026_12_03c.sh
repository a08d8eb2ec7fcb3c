#!/usr/bin/env bash
# H200 call A (2026-12-03, second session): the all-reduce variants (issue 15 item 1) and
# the prepared-call host cost (item 3): correctness of the new defaults on the GPU first, then
# the host cost, barrier-free timings and Nsight Compute of one rank's two-stage kernel, and
# the variant sweep under MPS. $OUT returns 8 files at most.
export PYTHONUNBUFFERED=1 PYTHONPATH=.
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; J=/tmp/jobs; mkdir -p $J
nvidia-smi -L
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
step "collectives (defaults)" 150 python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 30 --replays 100 --json $J/collectives.json 2>&1 | grep -v "^ " | tail -8
step "collectives (two-stage forced, no end barrier)" 100 env PEERDSL_TWO_STAGE_MIN_BYTES=0 python3 scripts/gpu_collectives.py --build build --tp 4 --steps 30 --replays 100 2>&1 | grep -v "^ " | tail -6
step "host cost" 150 python3 benchmarks/bench_ar_rms.py --build build --tp 4 --host-cost --json $OUT/host_cost.json 2>&1 | tail -30
for U in 1 4; do
  step "barrier-free all ranks U=$U" 40 python3 benchmarks/ncu_ar_one_rank.py --build build --path 2stage --world 4 --rows 1024 --unroll $U --block 256 --all-ranks 2>&1 | tail -6
  step "ncu U=$U" 90 ncu --clock-control none -k regex:allreduce_ --launch-skip 2 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct,gpu__time_duration.sum -o $J/ar2_u$U python3 benchmarks/ncu_ar_one_rank.py --build build --path 2stage --world 4 --rows 1024 --unroll $U --block 256 --no-graph > $J/ncu_u$U.log 2>&1; tail -3 $J/ncu_u$U.log
  ncu --import $J/ar2_u$U.ncu-rep --page details > $OUT/ar2_u$U.txt 2>&1
done
step "AR variant sweep" 300 python3 benchmarks/bench_ar_rms.py --ar-variants --build build --tp 2 4 --budget-s 80 --json $OUT/ar_variants.json 2>&1 | tail -60
true
