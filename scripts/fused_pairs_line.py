"""One line per TP of a bench_ar_rms.py JSON: each row count's path, our fused time, the vLLM
+ Triton pair's and their ratio (the session scripts print it after each run); with
--all-reduce, our all-reduce's path and time and vLLM's all-reduce time instead."""
import json
import sys

args = sys.argv[1:]
all_reduce = "--all-reduce" in args
d = json.load(open([a for a in args if a != "--all-reduce"][0]))
for tp in ("tp4", "tp2"):
    rows = d.get(tp, {}).get("rows", {}).items()
    if all_reduce:
        print(tp, "AR ours/vLLM", " ".join("%s %s %.1f/%.1f" % (k, r["ar_path"], r["ar_us"],
                                                               r["vllm_ar_us"]) for k, r in rows))
    else:
        print(tp, " ".join("%s %s %.1f/%.1f(%.2f)" % (k, r["path"], r["fused_us"],
                                                    r["vllm_pair_us"],
                                                    r["vllm_pair_us"] / r["fused_us"])
                           for k, r in rows))
