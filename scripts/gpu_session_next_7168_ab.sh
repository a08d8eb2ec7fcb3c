#!/usr/bin/env bash
# Next device call (prepared 2026-12-07, not run: that session's device time was spent). A/B
# of TP4 H = 7168's dispatch, twice interleaved: "now" is this tree's (the one-launch two-stage
# kernel U4V1, chosen from call M9's one sweep), "split" the previous choice
# (PEERDSL_FUSED_SPLIT=1); the vLLM AR + Triton pair in every run. Needs a build of this tree
# (`peerdsl build --arch sm_90 --ops all -o build`, then delete the .ptx files; carry build and
# peers_src from scripts/peer_sources.sh). About 100 s on the device.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/ab7168; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/ab7168.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
run() {  # name, extra env...
  local name=$1; shift
  step "$name" 120 env "$@" BENCH_ROWS="256 1024 2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build ${BUILD:-build} --tp 4 --hidden 7168 --vllm-header peers_src --json $W/$name.json > $W/$name.log 2>&1
  grep -i -m3 "error\|no report" $W/$name.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$name.json
}
for r in 1 2; do
  run now_r$r X=1
  run split_r$r PEERDSL_FUSED_SPLIT=1
done
true
