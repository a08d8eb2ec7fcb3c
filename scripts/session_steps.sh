# Shared steps of the device-call scripts from call Q1 on (source it after setting W, the
# work folder, and TAG, the name of the archive under $OUT that every step refreshes).
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT $W

step() {  # name, timeout (s), command...
  echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"
  rm -f $W/*.png; tar czf $OUT/$TAG.tgz -C $W .
}

bench_items() {  # round, build: issue 15 items 1 and 2 (H = 2880, 6144, 8192, TP4 and TP2)
  step "bench r$1" 110 env BENCH_SINGLE_GPU=0 BENCH_SWEEP=0 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 2 --hidden 2880 6144 8192 --vllm-header peers_src --json $W/bench_r$1.json > $W/bench_r$1.log 2>&1
  grep -i -m3 "error\|no report" $W/bench_r$1.log | cut -c1-400
  python3 scripts/fused_pairs_line.py $W/bench_r$1.json
  python3 scripts/fused_pairs_line.py --all-reduce $W/bench_r$1.json
}

forced_sweep() {  # name, timeout (s), rows, TPs, hidden sizes: bench_ar_rms's forced-path sweep
  step "$1" $2 env BENCH_ROWS="$3" BENCH_SINGLE_GPU=0 BENCH_SWEEP=1 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp $4 --hidden $5 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report\|mismatch" $W/$1.log | cut -c1-300
  python3 scripts/sweep_best_line.py $W/$1.json
}
