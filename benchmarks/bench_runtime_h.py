"""Runtime-H row kernels against the specialized ones on a GPU (issue 15 item 5: within 10%
at the same H), under the multi-process MPS harness of bench_ar_rms.py.

    peerdsl build --arch sm_90 --ops all -o build                 # here
    PYTHONPATH=. python3 benchmarks/bench_runtime_h.py --build build --tp 2 4 \\
        --hidden 2880 5120 6144 8192 12288 --rows 1 16 256 1024 4096

For every hidden size, row count and TP: us per call (graph of 20 calls, 30 replays, median
per rank, max over ranks) of the fused entry on the path dispatch takes (and the one-stage
and two-stage kernels forced, where valid), add + RMSNorm and the FP8 quant, once with the
specialized kernel (where one is built for H) and once with the runtime-H variant forced
(`comm.force_runtime_h`, as PEERDSL_FORCE_RUNTIME_H=1), with the ratio. Sizes with no
specialized kernel (5120, 12288) get the runtime-H times alone; shapes over 64 MiB (the
fallback all-reduce) are skipped. Before timing, each shape checks on the GPU that the
runtime-H outputs have the specialized kernel's bytes (or the unfused path's where no
specialized kernel is built): the "same bytes" column. Writes --json (default
$OUT/bench_runtime_h.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.rank_harness import graph_time_us, over_custom_limit  # noqa: E402
from benchmarks.rank_harness import (norm_inputs, rank_communicator, rank_env,  # noqa: E402
                                     run_ranks)

FUSED_PATHS = ("fused_1stage", "fused_2stage")


def timings(torch, comm, x, res, w, dev, sync) -> dict:
    """us per call of each row-kernel call for the communicator's current variant choice."""
    cap = comm.graph_capture
    got = {"fused_us": graph_time_us(torch, lambda: comm.fused_allreduce_rmsnorm(x, res, w),
                                     dev, sync, cap),
           "fused_path": comm.last_path,
           "rms_us": graph_time_us(torch, lambda: comm.add_rmsnorm(x, res, w), dev, sync),
           "quant_us": graph_time_us(torch, lambda: comm.per_token_quant_fp8(x), dev, sync)}
    saved = os.environ.get("PEERDSL_FUSED_PATH")
    try:
        for path in FUSED_PATHS:  # every rank forces the same paths in the same order
            os.environ["PEERDSL_FUSED_PATH"] = path
            try:
                comm.fused_allreduce_rmsnorm(x, res, w)
            except ValueError:  # not valid for this shape or world
                continue
            got[path + "_us"] = graph_time_us(
                torch, lambda: comm.fused_allreduce_rmsnorm(x, res, w), dev, sync, cap)
    finally:
        if saved is None:
            os.environ.pop("PEERDSL_FUSED_PATH", None)
        else:
            os.environ["PEERDSL_FUSED_PATH"] = saved
    return got


def same_bytes(comm, x, res, w, specialized: bool) -> bool:
    """Before timing, on the GPU: the runtime-H outputs (fused with FP8 + mirror, fused T,
    add + RMSNorm, quant) have the specialized kernel's bytes, or where none is built the
    unfused path's (fused == unfused, SPEC 2.3)."""
    import torch
    def outputs():
        return [t.clone() for t in (*comm.fused_allreduce_rmsnorm(
                    x, res, w, fp8_out=True, bf16_mirror=True),
                *comm.fused_allreduce_rmsnorm(x, res, w, gemma_norm=True),
                *comm.add_rmsnorm(x, res, w), *comm.per_token_quant_fp8(x))]
    comm.force_runtime_h = True
    got = outputs()
    if specialized:
        comm.force_runtime_h = False
        want = outputs()
    else:
        ar = comm.all_reduce(x)
        want = [t.clone() for t in (*comm.add_rmsnorm(ar, res, w, fp8_out=True,
                                                      bf16_mirror=True),
                                    *comm.add_rmsnorm(ar, res, w, gemma_norm=True))]
        got = got[:len(want)]
    comm.force_runtime_h = False
    return len(got) == len(want) and all(
        a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8))
        for a, b in zip(got, want))


def rank_main(rank, world, port, build, hiddens, rows_list) -> dict:
    torch, dist, dev, comm, sync = rank_communicator(rank, world, port, build)
    out = {}
    for hidden in hiddens:
        specialized = comm.built.row_kernel("add_rmsnorm", hidden).size_key == "H"
        for rows in rows_list:
            if over_custom_limit(rows, hidden):  # the fallback all-reduce: not ours
                continue
            x, res, w = norm_inputs(torch, rows, hidden, dev)
            entry = {"bytes_equal": same_bytes(comm, x, res, w, specialized)}
            for force in ((False, True) if specialized else (True,)):
                comm.force_runtime_h = force
                entry["runtime_h" if force else "specialized"] = timings(
                    torch, comm, x, res, w, dev, sync)
            comm.force_runtime_h = False
            out[f"{hidden}:{rows}"] = entry
    torch.cuda.synchronize(dev)
    dist.barrier()
    return out


def merge(reps: list[dict]) -> dict:
    """Max over ranks of every per-rank median."""
    merged = {}
    for key, entry in reps[0].items():
        merged[key] = {v: {k: (max(r[key][v][k] for r in reps) if k.endswith("_us") else t)
                           for k, t in times.items()} for v, times in entry.items()
                       if v != "bytes_equal"}
        merged[key]["bytes_equal"] = all(r[key]["bytes_equal"] for r in reps)
    return merged


def report(summary: dict) -> str:
    lines = []
    for tp in [k for k in summary if k.startswith("tp")]:
        lines += [f"\nTP{tp[2:]}: us per call, specialized / runtime-H (ratio rt/spec)",
                  "| H | rows | fused (path) | 1-stage | 2-stage | add+RMSNorm | FP8 quant | "
                  "same bytes |", "|---|---|---|---|---|---|---|---|"]
        for key, entry in summary[tp].items():
            hidden, rows = key.split(":")
            spec, rt = entry.get("specialized"), entry["runtime_h"]

            def cell(k):
                if k not in rt:
                    return "-"
                if spec is None or k not in spec:
                    return f"{rt[k]:.1f} (rt only)"
                return f"{spec[k]:.1f} / {rt[k]:.1f} ({rt[k] / spec[k]:.2f})"
            lines.append(f"| {hidden} | {rows} | {cell('fused_us')} {rt['fused_path']} | "
                         f"{cell('fused_1stage_us')} | {cell('fused_2stage_us')} | "
                         f"{cell('rms_us')} | {cell('quant_us')} | {entry['bytes_equal']} |")
        ratios = [entry["runtime_h"][k] / entry["specialized"][k]
                  for entry in summary[tp].values() if "specialized" in entry
                  for k in entry["specialized"] if k.endswith("_us") and k in entry["runtime_h"]]
        if ratios:
            lines.append("all bytes equal: " + str(all(e["bytes_equal"]
                                                       for e in summary[tp].values())))
            lines.append(f"worst runtime-H / specialized: {max(ratios):.3f} "
                         f"(median {sorted(ratios)[len(ratios) // 2]:.3f}, {len(ratios)} pairs)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, nargs="+", default=[2880, 5120, 6144, 8192, 12288])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 16, 256, 1024, 4096])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        rank, world, port = args.rank_worker
        rep = rank_main(rank, world, port, args.build, args.hidden, args.rows)
        print("REPORT " + json.dumps(rep), flush=True)
        return 0
    summary = {"hidden": args.hidden, "rows": args.rows}
    with rank_env(max(args.tp)) as env:
        for tp in args.tp:
            reps = run_ranks([sys.executable, __file__, "--build", args.build, "--hidden",
                              *map(str, args.hidden), "--rows", *map(str, args.rows)], tp, env,
                             timeout_s=540)
            if reps is None:
                return 1
            summary[f"tp{tp}"] = merge(reps)
    path = args.json or os.path.join(os.environ.get("OUT", "."), "bench_runtime_h.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(report(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
