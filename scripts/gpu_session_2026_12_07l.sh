#!/usr/bin/env bash
# Device call N5 (2026-12-07, second session): the proofs on the final tree's kernels (1ccff07's,
# which this tree builds byte for byte): the GPU fault suite and the collectives' runtime proof,
# TP2 and TP4, default dispatch. Carry build.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/n5; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; tar czf $OUT/n5.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step "faults" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-200
step "collectives" 100 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
true
