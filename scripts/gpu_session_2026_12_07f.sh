#!/usr/bin/env bash
# Device call M8 (2026-12-07). Call M1's probe at H = 7168, where a row's 896 packs fill 3.5
# slots of a 256-thread block and the norm-family kernels take 96-105 registers (2 blocks per
# SM): add_rmsnorm and the split path's gather kernel built with B threads per row and M
# blocks per SM (scripts/norm_block_probe_build.py --hidden 7168, the mappings that do not
# spill), all four ranks' kernels at once, beside the Triton add + RMSNorm on the same bytes;
# two interleaved rounds at 4096, 1024 and 256 rows.
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m8; mkdir -p $W
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $W/device.txt
timeout 240 env PYTHONPATH=. python3 scripts/norm_block_probe_run.py --build build_p7 --hidden 7168 \
  --mappings 256:0 448:2 896:1 224:0 --rounds 2 2>&1 | tee $W/probe.txt | grep -v "^$"
tar czf $OUT/m8.tgz -C $W .
