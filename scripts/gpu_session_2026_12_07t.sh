#!/usr/bin/env bash
# Device call Q1 (2026-12-07, fourth session). (1) On an H200 only: issue 15 items 1-3 on this
# tree's build (bench_ar_rms twice, H = 2880, 6144, 8192, TP4 and TP2, every row count,
# vLLM's all-reduce and the vLLM AR + Triton pair in the same rank processes; the eager host
# cost at TP4); on an H100 these cells were timed twice in call P1 (no kernel of theirs has
# changed since), so the runtime proof and fault suite run instead, which no call had run on
# P4's kernels. (2) On either card: the one-block-per-row runtime-H kernels (add + RMSNorm,
# the split path's gather, the FP8 quant) at MAXH 12288 and 16384 with every slot's reads
# predicated (build, sm_90 predicated_row_slots = 8) against the guarded reads (build_base),
# A/B twice interleaved, bench_runtime_h at TP4, H = 10240, 12288, 16384, 256 and 2048 rows.
# (3) On an H100: a forced-path sweep on build at TP4, H = 10240 and 12288, 64-256 rows (1.25-6 MiB),
# where MAXH 12288's floor (4 MiB) keeps the one-stage kernel and the split was not timed
# with its U = 4 stage 1. Carry build, build_base and peers_src.
W=/tmp/q1; TAG=q1; source scripts/session_steps.sh
ab() {  # name, build
  step "$1" 60 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build $2 --tp 4 --hidden 10240 12288 16384 --rows 256 2048 --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|differ\|mismatch" $W/$1.log | cut -c1-300
  tail -8 $W/$1.log | cut -c1-200
}
name=$(nvidia-smi --query-gpu=name --format=csv,noheader)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader
case "$name" in *H200*) h200=1;; *) h200=0;; esac
[ $h200 = 1 ] && bench_items 1 build
ab base_r1 build_base; ab new_r1 build
if [ $h200 = 1 ]; then
  step "host tp4" 90 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build --tp 4 --json $W/host_tp4.json > $W/host_tp4.log 2>&1
  tail -14 $W/host_tp4.log
else
  step "collectives" 90 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
  tail -3 $W/collectives.log | cut -c1-200
fi
ab base_r2 build_base; ab new_r2 build
if [ $h200 = 1 ]; then bench_items 2 build; else
  step "faults" 100 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
  tail -4 $W/faults.log | cut -c1-200
fi
[ $h200 = 1 ] && exit 0  # (the call's 600 s)
forced_sweep sweep 70 "64 128 256" 4 "10240 12288"
true
