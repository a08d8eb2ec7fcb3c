"""One line per TP of a bench_ar_rms.py JSON: each row count's path, our fused time, the vLLM
+ Triton pair's and their ratio (the session scripts print it after each run)."""
import json
import sys

d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    print(tp, " ".join("%s %s %.1f/%.1f(%.2f)" % (k, r["path"], r["fused_us"], r["vllm_pair_us"],
                                                r["vllm_pair_us"] / r["fused_us"])
                       for k, r in d.get(tp, {}).get("rows", {}).items()))
