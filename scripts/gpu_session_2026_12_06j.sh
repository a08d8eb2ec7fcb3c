#!/usr/bin/env bash
# Device call M2 (2026-12-06). The sm_90 norm-family kernels at H = 2880 with 384 threads a
# row (one pack each; lowering/targets.py norm_threads), from call M1's probe. A/B twice
# interleaved at H = 2880, TP4 and TP2, every row count: "old" is build_new (256 threads,
# 8fbfeef's kernels), "new" build_m (this tree); the vLLM AR + Triton pair in every run. Then
# the forced-path sweep on the new build (does dispatch still pick the fastest path at 2880?),
# the fault cases and runtime proof on it, and the tutorial's user kernel at 2880 (its
# variants take the target's B: fused == its unfused chain on the GPU).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m2; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/m2.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for side in old new; do
    b=build_new; [ $side = new ] && b=build_m
    step "$side r$round" 90 env BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $b --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/${side}_r$round.json > $W/${side}_r$round.log 2>&1
    tail -3 $W/${side}_r$round.log | grep -i error
    python3 scripts/fused_pairs_line.py $W/${side}_r$round.json
  done
done
step "sweep new" 150 env BENCH_ROWS="64 128 256 1024 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_m --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/sweep.json > $W/sweep.log 2>&1
tail -3 $W/sweep.log | grep -i error
python3 scripts/fused_pairs_line.py $W/sweep.json
step "faults" 200 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_m --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-300
step "collectives" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_m --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-300
step "example" 150 env PYTHONPATH=. python3 examples/ar_bias_rmsnorm/run_gpu.py --build build_m --tp 2 4 --hidden 2880 6144 --rows 1 64 1024 4096 --json $W/example.json > $W/example.log 2>&1
tail -12 $W/example.log | cut -c1-300
true
