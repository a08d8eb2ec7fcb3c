#!/usr/bin/env bash
# H200 call G1 (2026-12-04): the split fused schedule (S = 1: stage 1, then the gather
# kernel with a grid of one block per row) forced beside every other fused path, TP4 at
# H = 2880, 6144, 8192 and TP2 at 6144; runtime-H with the 3- and 6-pack classes and
# clamped reads 3 ahead; TP2 all-reduce variants at small rows (LL against one-stage).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
step() { echo "=== $1 ($(date +%T))"; shift; timeout "$@"; echo "=== rc=$?"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
step "bench tp4" 300 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 4 --hidden 2880 6144 8192 --json $OUT/bench_g1_tp4.json > $OUT/bench_g1_tp4.log 2>&1
python3 - <<'PY'
import json, os
d = json.load(open(os.environ.get("OUT", "/tmp/out") + "/bench_g1_tp4.json"))
t = d.get("tp4", d)
for key, r in sorted(t["rows"].items(), key=lambda kv: tuple(map(int, kv[0].split(":")))):
    p = r.get("paths_us", {})
    f = " ".join(f"{k[:-3].replace('fused_2stage:', '2s:')}={v:.1f}" for k, v in p.items() if k.endswith("_us"))
    print(key, r.get("path"), "fused %.1f" % r["fused_us"], "ar %.1f rms %.1f" % (r["ar_us"], r["rms_us"]), f, p.get("mismatch", ""))
PY
step "bench tp2" 200 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --build build --tp 2 --hidden 6144 2880 --json $OUT/bench_g1_tp2.json > $OUT/bench_g1_tp2.log 2>&1
grep "^|\|^TP" $OUT/bench_g1_tp2.log | head -40
step "runtime-H bench" 200 env PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 4 --hidden 5120 6144 8192 --rows 16 1024 4096 --json $OUT/bench_runtime_h_g1.json > $OUT/runtime_h_g1.log 2>&1
tail -30 $OUT/runtime_h_g1.log
[ -n "$AR_VARIANTS" ] && step "ar variants tp2" 150 env PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --ar-variants --build build --tp 2 --rows 1 16 32 64 128 --quick --json $OUT/ar_variants_g1.json > $OUT/ar_variants_g1.log 2>&1
[ -n "$AR_VARIANTS" ] && grep "^|" $OUT/ar_variants_g1.log | head -12
true
