#!/usr/bin/env bash
# Device call S3 (2026-12-07, sixth session): S2's item-5 run at TP4, then S1's A/B of the
# streamed halves (both, r1, c, s, d as there), as many interleaved rounds as the call's
# time allows. S1 and S2 could not start as separate calls (eight refused starts). Carry
# build, build_vars (scripts/streaming_variants.sh) and peers_src.
W=/tmp/s3; TAG=s3; source scripts/session_steps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for v in c s d r1; do rm -rf build_$v; cp -r build build_$v; cp -r build_vars/$v/. build_$v/; done
step "runtime-H tp4" 170 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 2880 4096 6144 7168 8192 --rows 16 1024 4096 --json $W/runtime_h_tp4.json > $W/runtime_h_tp4.log 2>&1
grep -i -m3 "error\|no report\|differ" $W/runtime_h_tp4.log | cut -c1-300
tail -25 $W/runtime_h_tp4.log
ab() {  # name, build
  step "$1" 60 env BENCH_ROWS="2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
for r in 1 2; do
  for v in both:build r1:build_r1 c:build_c s:build_s d:build_d; do ab ${v%%:*}_r$r ${v#*:}; done
done
true
