#!/usr/bin/env bash
# Device call P4 (2026-12-07, third session). The split two-stage kernel at MAXH 12288 and
# 16384 (TP4 dispatch's two-stage form there since call P3) ran stage 1 with U = 0, one shard
# pack per thread per row; stage 1 alone holds no row, so it now builds U = 4 (112
# registers, no spill). A/B twice interleaved, the split path forced: build_base (U = 0) and
# build (U = 4), TP4, H = 10240, 12288, 16384, 256 and 2048 rows, the pair in every run. Then one
# forced-path sweep on the new build (every path's bytes against the unfused path's).
# Carry build, build_base and peers_src.
W=/tmp/p4; TAG=p4; source scripts/session_steps.sh
ab() {  # name, build, unroll
  step "$1" 120 env PEERDSL_FUSED_PATH=fused_2stage PEERDSL_FUSED_SPLIT=1 PEERDSL_FUSED_UNROLL=$3 BENCH_ROWS="256 2048" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 --hidden 10240 12288 16384 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for r in 1 2; do
  ab base_r$r build_base 0
  ab new_r$r build 4
done
forced_sweep sweep 100 1024 4 "10240 12288 16384"
true
