#!/usr/bin/env bash
# Builds the variants that device call S1 (scripts/gpu_session_2026_12_07zb.sh) times, from
# this tree, into build_vars/{c,s,d,r1}: each holds only the kernels (and manifest) that
# differ from build/, so that all four fit the carry beside build/. The tree is edited for
# each build and restored with `git checkout` (run it on a clean tree):
#   c: stage 1's inputs not streamed (the gather's residual / residual_out only)
#   s: the gather's residual / residual_out not streamed (stage 1's inputs only)
#   d: both, and the gather's out streamed too (a probe, not a candidate)
#   r1: neither (build_r1, the tree before dsl.streaming; copied if present)
# build/ must be this tree's sm_90 build (peerdsl build --arch sm_90 --ops all -o build).
set -euo pipefail
cd "$(dirname "$0")/.."
git diff --quiet peerdsl || { echo "peerdsl/ has changes: commit or stash them first" >&2; exit 1; }
OPS=fused_ar_rms_2stage,fused_ar_rms_gather
STAGE1=peerdsl/ops/fused_ar_rms_2stage.py GATHER=peerdsl/ops/fused_ar_rms_gather.py
variant() {  # name: build the edited tree into build_<name>, keep what differs, restore
  rm -rf build_$1 && cp -r build build_$1
  peerdsl build --arch sm_90 --ops $OPS -o build_$1 -q
  find build_$1 -name "*.ptx" -delete
  git checkout -q peerdsl
  rm -rf build_vars/$1 && mkdir -p build_vars/$1/sm_90
  for f in build_$1/sm_90/*; do
    cmp -s "$f" build/sm_90/$(basename "$f") || cp "$f" build_vars/$1/sm_90/
  done
  echo "$1: $(ls build_vars/$1/sm_90 | wc -l) files differ from build/"
}
sed -i 's/H, T, W, bool(S))/H, T, W, False)/; s/H, T, W, U, bool(S))/H, T, W, U, False)/' $STAGE1
variant c
sed -i 's/gather_norm_rows(staging, dsl.streaming(residual), weight, out,/gather_norm_rows(staging, residual, weight, out,/; s/dsl.streaming(residual_out), q, scale/residual_out, q, scale/' $GATHER
variant s
sed -i 's/weight, out,$/weight, dsl.streaming(out),/' $GATHER
variant d
if [ -d build_r1 ]; then
  rm -rf build_vars/r1 && mkdir -p build_vars/r1/sm_90
  for f in build_r1/sm_90/*; do
    cmp -s "$f" build/sm_90/$(basename "$f") || cp "$f" build_vars/r1/sm_90/
  done
fi
du -sh build_vars/*
