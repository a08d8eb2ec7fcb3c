"""Where the split fused call's time goes (issue 15 item 2): each launch of it timed alone.

The split schedule (ops/fused_ar_rms_2stage.py S = 1) is two launches: stage 1 (reduce-
scatter into staging, a phase barrier) and the gather + add + RMSNorm kernel
(ops/fused_ar_rms_gather.py). This times, under the multi-process MPS harness of
bench_ar_rms.py (graphs of 20 calls, 30 replays, median per rank, max over ranks):

  split       the whole fused call, S = 1
  stage1      the same call with the gather launch left out
  gather      the same call with the stage-1 launch left out (it reads the staging the last
              stage 1 left: the same bytes move, only the values are stale)
  one_launch  the fused two-stage kernel in one launch (dispatch's schedule with S = 0)
  ar, rms     our all-reduce and our add + RMSNorm (the unfused pair)

    PYTHONPATH=. python3 benchmarks/bench_fused_parts.py --build build --tp 4 \\
        --hidden 2880 6144 --rows 1024 4096
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.rank_harness import graph_time_us  # noqa: E402
from benchmarks.rank_harness import (norm_inputs, rank_communicator, rank_env,  # noqa: E402
                                     run_ranks)


def _without(comm, prefix: str):
    """comm's launch, leaving out the kernels whose name starts with `prefix`."""
    real = comm._launch

    def launch(name, *args, **kwargs):
        if not name.startswith(prefix):
            real(name, *args, **kwargs)
    return launch


def rank_main(rank, world, port, build, hiddens, rows_list) -> dict:
    torch, dist, dev, comm, sync = rank_communicator(rank, world, port, build)
    cap = comm.graph_capture
    out = {}
    os.environ["PEERDSL_FUSED_PATH"] = "fused_2stage"
    for hidden in hiddens:
        for rows in rows_list:
            x, res, w = norm_inputs(torch, rows, hidden, dev)
            fused = lambda: comm.fused_allreduce_rmsnorm(x, res, w)  # noqa: E731
            try:
                fused()
            except ValueError:  # past the staging for this world: no two-stage path
                continue
            os.environ["PEERDSL_FUSED_SPLIT"] = "0"  # whatever dispatch's schedule is
            r = {"one_launch": graph_time_us(torch, fused, dev, sync, cap)}
            os.environ["PEERDSL_FUSED_SPLIT"] = "1"
            r["split"] = graph_time_us(torch, fused, dev, sync, cap)
            real = comm._launch
            for part, skip in (("stage1", "fused_ar_rms_gather"),
                               ("gather", "fused_ar_rms_2stage")):
                comm._launch = _without(comm, skip)
                try:
                    r[part] = graph_time_us(torch, fused, dev, sync, cap)
                finally:
                    comm._launch = real
            del os.environ["PEERDSL_FUSED_SPLIT"]
            r["ar"] = graph_time_us(torch, lambda: comm.all_reduce(x), dev, sync, cap)
            r["rms"] = graph_time_us(torch, lambda: comm.add_rmsnorm(x, res, w), dev, sync)
            out[f"{hidden}:{rows}"] = r
    torch.cuda.synchronize(dev)
    dist.barrier()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[4])
    ap.add_argument("--hidden", type=int, nargs="+", default=[2880, 6144])
    ap.add_argument("--rows", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        rank, world, port = args.rank_worker
        print("REPORT " + json.dumps(rank_main(rank, world, port, args.build, args.hidden,
                                               args.rows)), flush=True)
        return 0
    summary = {}
    with rank_env(max(args.tp)) as env:
        for tp in args.tp:
            cmd = [sys.executable, os.path.abspath(__file__), "--build", args.build,
                   "--hidden", *map(str, args.hidden), "--rows", *map(str, args.rows)]
            reports = run_ranks(cmd, tp, env, timeout_s=240)
            if reports is None:
                return 1
            summary[f"tp{tp}"] = {k: {p: max(rep[k][p] for rep in reports) for p in reports[0][k]}
                                  for k in reports[0]}
    path = args.json or os.path.join(os.environ.get("OUT", "/tmp"), "bench_fused_parts.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    for tp, rows in summary.items():
        print(f"{tp}: us per call (max over ranks of the medians)")
        print("| H:rows | " + " | ".join(next(iter(rows.values()))) + " |")
        for key, r in rows.items():
            print(f"| {key} | " + " | ".join(f"{v:.1f}" for v in r.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
