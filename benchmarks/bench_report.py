"""The SPEC section 8 benchmark's summary: ranks merged, the Markdown tables, the plot.

Pure functions of the JSON that benchmarks/bench_ar_rms.py writes (no GPU), so a saved run
can be redrawn anywhere: `python3 benchmarks/bench_ar_rms.py --replot data/bench_X.json`.
"""
from __future__ import annotations

import statistics


def merge(reps: list[dict]) -> dict:
    """Max over ranks of every per-rank median."""
    out = {"null_us": max(r["null_us"] for r in reps),
           "host_us": max(r.get("host_us", 0) for r in reps),
           "host_profile": reps[0].get("host_profile", ""), "rows": {}}
    for key, first in reps[0]["rows"].items():
        row = out["rows"][key] = {k: _merged(k, [r["rows"][key][k] for r in reps])
                                  for k in first}
        for k in first:  # BENCH_ROUNDS: each round's slowest rank, then the rounds' median
            if k.endswith("_us_rounds"):
                row[k[:-len("_rounds")]] = statistics.median(row[k])
        if "paths_us" in first:
            row["paths_us"] = {p: max(r["rows"][key]["paths_us"][p] for r in reps)
                               for p in first["paths_us"] if p != "mismatch"}
            bad = sorted({m for r in reps for m in r["rows"][key]["paths_us"].get("mismatch", [])})
            if bad:
                row["paths_us"]["mismatch"] = bad
    return out


def _merged(key: str, values: list):
    """One rank-merged value: the slowest rank's time, every rank's check, else rank 0's."""
    if isinstance(values[0], bool):
        return all(values)
    if key.endswith("_us") and key != "paths_us":
        return max(values)
    if key.endswith("_us_rounds"):
        return [max(v) for v in zip(*values)]
    return values[0]


def report(summary: dict) -> str:
    bw = summary["bandwidth_Bps"]
    lines = []
    for tp in [k for k in summary if k.startswith("tp")]:
        s = summary[tp]
        lines.append(f"\nTP{tp[2:]} (null collective {s['null_us']:.1f} us, host cost of one "
                     f"eager fused call {s['host_us']:.1f} us)")
        pair = all("pair_us" in r for r in s["rows"].values())  # (runs before 2026-12-04: no)
        lines.append("| H | rows | MiB | all-reduce (path) | add+RMSNorm | sum | fused (path) | "
                     "unfused/fused | byte floor (all ranks, one HBM) |"
                     + (" pair in one graph | pair/fused |" if pair else ""))
        lines.append("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if pair else ""))
        world = int(tp[2:])
        for key, r in s["rows"].items():
            hidden, rows = map(int, key.split(":"))
            nbytes = rows * hidden * 2
            floor = world * (world + 4) * nbytes / bw * 1e6
            tot = r["ar_us"] + r["rms_us"]
            lines.append(f"| {hidden} | {rows} | {nbytes / 2**20:.2f} | {r['ar_us']:.1f} "
                         f"({r['ar_path']}) | {r['rms_us']:.1f} | {tot:.1f} | {r['fused_us']:.1f} "
                         f"({r['path']}) | {tot / r['fused_us']:.2f}x | {floor:.1f} |"
                         + (f" {r['pair_us']:.1f} | {r['pair_us'] / r['fused_us']:.2f}x |"
                            if pair else ""))
    for tp in [k for k in summary if k.startswith("tp")]:
        swept = {k: r["paths_us"] for k, r in summary[tp]["rows"].items() if "paths_us" in r}
        if not swept:
            continue
        lines.append(f"\nTP{tp[2:]}, each fused path forced (PEERDSL_FUSED_PATH), us per call; "
                     f"null collective {summary[tp]['null_us']:.1f} us")
        cols = sorted({p[:-3] for paths in swept.values() for p in paths if p.endswith("_us")},
                      key=lambda p: (not p.startswith("ll"), not p.startswith("fused_1"), p))
        lines.append("| H | rows | " + " | ".join(cols) + " | dispatch chose | bytes differ |")
        lines.append("|---|---|" + "---|" * (len(cols) + 2))
        for key, paths in swept.items():
            hidden, rows = key.split(":")
            cells = [f"{paths[p + '_us']:.1f}" if p + "_us" in paths else "-" for p in cols]
            lines.append(f"| {hidden} | {rows} | " + " | ".join(cells)
                         + f" | {summary[tp]['rows'][key]['path']} | "
                         + (", ".join(paths.get("mismatch", [])) or "none") + " |")
    h0 = summary.get("hidden", [6144])[0]
    if not summary.get("single_gpu"):
        return "\n".join(lines)
    lines.append("\nSingle GPU add + RMSNorm, H=%d bf16, us (copy %.2f TB/s)" % (h0, bw / 1e12))
    lines.append("| rows | torch eager | torch.compile | Triton | peerdsl | peerdsl % of floor | "
                 "torch quant | peerdsl quant |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for rows, r in summary["single_gpu"].items():
        floor = 4 * int(rows) * h0 * 2 / bw * 1e6
        lines.append(f"| {rows} | {r['torch_eager']:.2f} | {r.get('torch_compile', float('nan')):.2f}"
                     f" | {r['triton']:.2f} | {r['peerdsl']:.2f} | {100 * floor / r['peerdsl']:.0f}%"
                     f" | {r['torch_quant']:.2f} | {r['peerdsl_quant']:.2f} |")
    return "\n".join(lines)


def plot(summary: dict, path: str) -> None:
    """us per call against rows: one panel per TP and hidden size, a line per path (the
    measured pieces, the fused dispatch, and each fused path forced where it was swept)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    tps = [k for k in summary if k.startswith("tp")]
    hiddens = summary.get("hidden", [6144])
    fig, axes = plt.subplots(len(tps), len(hiddens), figsize=(5.5 * len(hiddens), 4.2 * len(tps)),
                             squeeze=False)
    for row, tp in enumerate(tps):
        rows = summary[tp]["rows"]
        for col, h in enumerate(hiddens):
            ax = axes[row][col]
            keys = [k for k in rows if k.startswith(f"{h}:")]
            xs = [int(k.split(":")[1]) for k in keys]
            for name, label in (("ar_us", "all-reduce"), ("rms_us", "add+RMSNorm"),
                                ("fused_us", "fused dispatch")):
                ax.plot(xs, [rows[k][name] for k in keys], marker="o", label=label)
            ax.plot(xs, [rows[k]["ar_us"] + rows[k]["rms_us"] for k in keys], linestyle="--",
                    label="unfused sum")
            for forced in ("ll+rmsnorm", "fused_1stage", "fused_2stage"):
                pts = [(x, rows[k]["paths_us"][forced + "_us"]) for x, k in zip(xs, keys)
                       if forced + "_us" in rows[k].get("paths_us", {})]
                if pts:
                    ax.plot(*zip(*pts), linestyle=":", marker=".", label=f"{forced} (forced)")
            ax.axhline(summary[tp]["null_us"], color="gray", linestyle="-.",
                       label="null collective")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{tp.upper()} H={h} bf16 (ranks share one H200)")
            ax.set_xlabel("rows")
            ax.set_ylabel("us per call (graph)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
