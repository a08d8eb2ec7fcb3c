#!/usr/bin/env bash
# Device call L5 (2026-12-06). Issue 15 items 1 and 2 at 1024-4096 rows, TP4, on the H100
# this session gets: in call L4 our all-reduce at H = 6144 x 4096 rows took 192-193 us
# against vLLM's 181-183 (on the H200 of 2026-12-03 it was 1.06x ahead), and the fused entry
# at H = 2880 x 4096 rows was 1.11-1.13x the vLLM AR + Triton pair (goal 1.2). Every built
# all-reduce variant timed (bench_ar_variants.py), then the forced fused paths and vLLM's
# AR beside them in one bench_ar_rms.py run (BENCH_SWEEP=1).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l5; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/l5.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
step "ar variants" 170 env PYTHONPATH=. python3 benchmarks/bench_ar_variants.py --build build_new --tp 4 --rows 1024 2048 4096 --budget-s 120 --json $W/ar_variants.json > $W/ar_variants.log 2>&1
tail -30 $W/ar_variants.log | cut -c1-200
step "sweep" 200 env BENCH_ROWS="1024 2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 --hidden 2880 6144 --vllm-header peers_src --json $W/sweep.json > $W/sweep.log 2>&1
tail -3 $W/sweep.log | grep -i error
python3 scripts/fused_pairs_line.py $W/sweep.json
true
