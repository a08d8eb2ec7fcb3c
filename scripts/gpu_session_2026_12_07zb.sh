#!/usr/bin/env bash
# Device call S1 (2026-12-07, sixth session). The split fused path's streamed accesses
# (R3/R4) took 7-12% off TP4/TP2 2880 x 2048 rows but cost 1% at TP4 2880 x 4096. Which half
# gives the gain and which the cost? Five builds of the split kernels, interleaved twice,
# the pair in every run: both halves (build, the tree's), neither (r1), the gather's only
# (c: stage 1's inputs plain), stage 1's only (s: the gather's residual/residual_out plain),
# and both plus the gather's out streamed (d: a probe of whether out's stores push the
# shards out of L2 under MPS; not a candidate, since the next kernel reads out). (A probe e,
# the staging shards with an L2 evict_last cache policy, was dropped before the call: under
# MPS the L2 set-aside that evict_last lines use is 0 unless the daemon starts with one.)
# Carry build, build_vars (each variant's changed kernels and manifest, made by
# scripts/streaming_variants.sh) and peers_src.
W=/tmp/s1; TAG=s1; source scripts/session_steps.sh
for v in c s d r1; do rm -rf build_$v; cp -r build build_$v; cp -r build_vars/$v/. build_$v/; done
ab() {  # name, build
  step "$1" 100 env BENCH_ROWS="2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 2 --hidden 2880 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for r in 1 2; do
  for v in both:build r1:build_r1 c:build_c s:build_s d:build_d; do ab ${v%%:*}_r$r ${v#*:}; done
done
true
