#!/usr/bin/env bash
# Device call N1 (2026-12-07, second session). (1) The runtime proof with the LL and fused-LL
# ranges at 1 MiB, so the small shapes take the reworked one-launch ll+rmsnorm kernel (pushes
# spread over the grid, a row's lines read in groups of 16 before their waits). (2) That kernel
# forced (PEERDSL_FUSED_PATH=ll+rmsnorm) on this tree's build (`build`) and on 1ccff07's
# (`build_base`), and the default dispatch (fused_1stage at these rows), twice interleaved, at
# 1-64 rows, H = 2880 / 6144 / 8192, TP4 and TP2, with the vLLM AR + Triton pair in every run.
# (3) The pending A/B of TP4 7168's one-launch choice against PEERDSL_FUSED_SPLIT=1.
# Carry build, build_base and peers_src.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/n1; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/n1.tgz -C $W .; }
bench() {  # name, build, timeout, extra env...
  local name=$1 build=$2 limit=$3; shift 3
  step "$name" $limit env "$@" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $build --tp ${TPS:-4 2} --hidden ${HID:-2880 6144 8192} --vllm-header peers_src --json $W/$name.json > $W/$name.log 2>&1
  grep -i -m3 "error\|no report" $W/$name.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$name.json
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
LL="PEERDSL_LL_MAX_BYTES=4194304 PEERDSL_FUSED_LL_MAX_BYTES=4194304"
step "collectives" 90 env PEERDSL_LL_MAX_BYTES=1048576 PEERDSL_FUSED_LL_MAX_BYTES=1048576 PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
for r in 1 2; do
  bench ll_new_r$r build 70 $LL PEERDSL_FUSED_PATH=ll+rmsnorm BENCH_ROWS="1 4 16 64"
  bench ll_base_r$r build_base 70 $LL PEERDSL_FUSED_PATH=ll+rmsnorm BENCH_ROWS="1 4 16 64"
  bench default_r$r build 70 BENCH_ROWS="1 4 16 64"
done
for r in 1 2; do
  TPS=4 HID=7168 bench ab7168_now_r$r build 60 X=1 BENCH_ROWS="256 1024 2048 4096"
  TPS=4 HID=7168 bench ab7168_split_r$r build 60 PEERDSL_FUSED_SPLIT=1 BENCH_ROWS="256 1024 2048 4096"
done
true
