#!/usr/bin/env bash
# Device call L7 (2026-12-06). The proofs on this session's final sm_90 dispatch (the fused
# two-stage kernel from 768 KiB at TP4 with one row in flight up to 256 rows, the one-stage
# rows kernel at TP2 only, the one-stage all-reduce up to the 64 MiB custom cap): the fault
# cases (every rank raises or the call is exact, the communicator recovers), then the runtime
# proof (every collective and the fused entry exact, eager and graph-replayed).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/l7; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; tar czf $OUT/l7.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step "faults" 200 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-300
step "collectives" 150 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-300
true
