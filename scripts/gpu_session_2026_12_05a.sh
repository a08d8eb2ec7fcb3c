#!/usr/bin/env bash
# H200 call J1 (2026-12-05). (1) The LL kernel with its epoch advanced in every block's copy
# with plain stores (no done counter: no atomic, no release) and every poll re-reading the W
# lines of a half pack together (not one peer's line after another), against 87825a8, A/B twice
# interleaved: base_src/ + build_base_full/ (87825a8: runtime and kernels, the old Signal
# layout) and this tree + build_new/; TP4 and TP2, H = 6144, 1-256 rows, vLLM's one-stage
# kernel in every run as is and with SPEC's orderings at both barriers / the start only / the
# end only (shim stages 3, 5, 6) and ours (4); then the new LL at 16 and 64 rows (LL cap
# 1 MiB) against the same run's vLLM, with the fused paths forced (ll+rmsnorm among them: now one
# launch, ops/fused_ar_rms_ll.py). (2) The runtime proof on the new kernels, with the LL and the
# fused entry's LL range raised to 1 MiB so that the small shapes take them.
# (3) Host cost of eager calls (item 3), TP4 under MPS and TP1 without, after an idle GPU with
# the thread asleep and spinning. (4) The fused one-stage rows kernel at H = 2880, V = 4 / 2.
# (5) The fault suite.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/j1; mkdir -p $W; ROOT=$PWD
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/j1.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for round in 1 2; do
  for side in base new; do
    if [ $side = base ]; then dir=$ROOT/base_src; build=$ROOT/build_base_full; else dir=$ROOT; build=$ROOT/build_new; fi
    (cd $dir && step "ab $side r$round" 75 env BENCH_VLLM_SPEC=1 BENCH_ROWS="1 4 16 64 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $build --tp 4 2 --hidden 6144 --vllm-header $ROOT/peers_src --json $W/ab_${side}_r$round.json > $W/ab_${side}_r$round.log 2>&1)
    python3 scripts/spec_stages_line.py $W/ab_${side}_r$round.json
  done
done
step "ll cap 1 MiB" 70 env PEERDSL_LL_MAX_BYTES=1048576 BENCH_ROWS="1 16 64" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 2 --hidden 6144 --vllm-header peers_src --json $W/ll_cap.json > $W/ll_cap.log 2>&1
python3 scripts/spec_stages_line.py $W/ll_cap.json
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); [print(tp, k, {p: round(v, 1) for p, v in r.get('paths_us', {}).items() if p.endswith('_us')}) for tp in ('tp4', 'tp2') for k, r in d.get(tp, {}).get('rows', {}).items()]" $W/ll_cap.json
step "collectives" 80 env PEERDSL_LL_MAX_BYTES=1048576 PEERDSL_FUSED_LL_MAX_BYTES=1048576 PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --steps 5 --replays 10 --json $W/collectives.json > $W/collectives.log 2>&1
tail -3 $W/collectives.log | cut -c1-200
step "host tp4" 110 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build_new --tp 4 --json $W/host_tp4.json > $W/host_tp4.log 2>&1
tail -14 $W/host_tp4.log
step "host tp1" 60 env PYTHONPATH=. python3 benchmarks/host_cost_gpu.py --build build_new --tp 1 --json $W/host_tp1.json > $W/host_tp1.log 2>&1
tail -14 $W/host_tp1.log
step "faults" 100 env PYTHONPATH=. python3 scripts/gpu_collectives.py --build build_new --tp 2 4 --faults-only --json $W/faults.json > $W/faults.log 2>&1
tail -4 $W/faults.log | cut -c1-200
for v in 4 2; do
  step "rows V=$v" 45 env PEERDSL_FUSED_1STAGE_ROWS=$v BENCH_ROWS="64 128 256" BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build_new --tp 4 --hidden 2880 --vllm-header peers_src --json $W/rows_v$v.json > $W/rows_v$v.log 2>&1
  python3 scripts/fused_pairs_line.py $W/rows_v$v.json
done
true
