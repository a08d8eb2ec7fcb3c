#!/usr/bin/env bash
# Device call M9 (2026-12-07). The sm_90 norm-family kernels at H = 7168 with 224 threads a
# row (four full slots; call M8's probe), A/B twice interleaved at H = 7168, TP4 and TP2,
# 256-4096 rows: "old" is build_m (256 threads), "new" build_m2 (this tree). The new side's
# first run sweeps every fused path with its bytes checked against the unfused path's.
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; W=/tmp/m9; mkdir -p $W
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; rm -f $W/*.png; tar czf $OUT/m9.tgz -C $W .; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
run() {  # name, build, sweep
  step "$1" 120 env BENCH_ROWS="256 1024 2048 4096" BENCH_SINGLE_GPU=0 BENCH_SWEEP=$3 PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build $2 --tp 4 2 --hidden 7168 --vllm-header peers_src --json $W/$1.json > $W/$1.log 2>&1
  grep -i -m3 "error\|no report" $W/$1.log | cut -c1-300
  python3 scripts/fused_pairs_line.py $W/$1.json
}
run old_r1 build_m 0
run new_r1 build_m2 1
python3 - $W/new_r1.json <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    for k, r in d.get(tp, {}).get("rows", {}).items():
        p = r.get("paths_us", {})
        print(tp, k, "mismatch:", p.get("mismatch", "none"), {n[:-3]: round(v, 1) for n, v in p.items() if n.endswith("_us")})
PY
run old_r2 build_m 0
run new_r2 build_m2 0
true
