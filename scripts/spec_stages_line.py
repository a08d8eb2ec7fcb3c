"""Per TP of a bench_ar_rms.py JSON made with BENCH_VLLM_SPEC=1: each row count's all-reduce
(ours, its path) beside vLLM's one-stage kernel as is (1), with SPEC section 3's orderings at
both barriers (3), at the start only (5), at the end only (6), and with our barriers (4), and
whether each alternative's bytes equal vLLM's (the session scripts print it after each run)."""
import json
import sys

d = json.load(open(sys.argv[1]))
for tp in ("tp4", "tp2"):
    s = d.get(tp, {})
    print(tp, "null %.1f" % s.get("null_us", 0))
    for k, r in s.get("rows", {}).items():
        stages = " ".join("s%d %.1f" % (n, r["vllm_ar%d_us" % n]) for n in (1, 3, 5, 6, 4, 7)
                          if "vllm_ar%d_us" % n in r)
        equal = all(r.get("vllm_ar%d_equal" % n, True) for n in (3, 4, 5, 6, 7))
        print("  %s: ours %.1f (%s) | vllm %s | equal %s" % (
            k.split(":")[1], r["ar_us"], r["ar_path"], stages, equal))
