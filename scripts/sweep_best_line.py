"""One line per TP and row count of a bench_ar_rms.py JSON run with BENCH_SWEEP=1: dispatch's
path and time, the vLLM AR + Triton pair's, the fastest forced path, every forced path's
time, and the paths whose bytes differed from the unfused path's (the session scripts print
it after each sweep).

    python3 scripts/sweep_best_line.py SWEEP.json
"""
import json
import sys

d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    for k, r in d.get(tp, {}).get("rows", {}).items():
        p = {n[:-3]: round(v, 1) for n, v in r.get("paths_us", {}).items() if n.endswith("_us")}
        p.pop("unfused", None)  # the reference path, not a fused one
        best = min(p, key=p.get) if p else "-"
        print(tp, k, r["path"], round(r["fused_us"], 1), "pair", round(r.get("vllm_pair_us", 0), 1),
              "best", best, p.get(best), p, r.get("paths_us", {}).get("mismatch", ""))
