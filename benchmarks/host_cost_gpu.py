"""Host cost of one eager collective call on a GPU machine, plain and prepared (issue 15).

    python3 benchmarks/host_cost_gpu.py --build build [--tp 4] [--hidden 6144] [--rows 16 2]
    python3 benchmarks/bench_ar_rms.py --build build --tp 4 --host-cost      (the same)

One process per rank over gloo, sharing the GPUs under an MPS daemon started and stopped
here when there are fewer GPUs than ranks (scripts/gpu_collectives.py's harness), with
Communicator(check_errors=False) as in benchmarks/bench_ar_rms.py. For each row count and
each call, on every rank:

  back_to_back  CPU time (this thread's) and wall time per call over CALLS calls made with
                no synchronization between them (the GPU runs behind; every call is
                collective, so the ranks stay in step); the median of ROUNDS rounds;
  after_idle    the CPU and wall time of one call made 50 ms after the GPU went idle
                (synchronize, barrier, sleep), the median of IDLE calls;
  after_idle_busy  the same, but the thread spins through the 50 ms instead of sleeping: the
                GPU idles as before while the CPU stays awake, which separates the cost of
                waking the host thread (and its core) from the cost of an idle GPU.

`--tp 1` runs one process on the GPU with no MPS daemon (the floors there are the driver's
own, without MPS's client-server hop).

Calls: the plain `fused_allreduce_rmsnorm(x, residual, weight)` and `all_reduce(x)`, and
their prepared forms (`comm.prepare_*`, runtime/prepared.py; the fused one also with
`stage_input=True`). Floors beside them: one cuLaunchKernel of a local kernel packed once
(the prepared launch alone) and one small torch op (`torch.add(a, 1, out=b)`). Every
prepared result is checked bitwise against the plain call's. Reports the max over ranks of
each median (us), writes $OUT/host_cost.json (or --json).

Bounded: the group's timeout is 120 s, kernels give up spinning after 1 s, and the parent
kills every rank after --timeout seconds (default 300).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.rank_harness import rank_env, run_ranks  # noqa: E402

CALLS, ROUNDS, IDLE, IDLE_S = 500, 3, 20, 0.05
KINDS = ("back_to_back", "after_idle", "after_idle_busy")


def _digest(torch: Any, ts: Any) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(t.contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def rank_main(rank: int, world: int, port: int, build: str, hidden: int,
              rows_list: list[int]) -> dict:
    import torch
    import torch.distributed as dist
    from peerdsl.runtime.communicator import Communicator
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    torch.cuda.set_device(dev)
    comm = Communicator(device=dev, build_dir=build, check_errors=False, timeout_s=1.0)
    perf, thread = time.perf_counter_ns, time.thread_time_ns

    def settle() -> None:
        torch.cuda.synchronize(dev)
        dist.barrier()

    def back_to_back(fn: Callable[[], Any]) -> dict:
        cpu, wall = [], []
        for _ in range(ROUNDS):
            settle()
            c0, t0 = thread(), perf()
            for _ in range(CALLS):
                fn()
            t1, c1 = perf(), thread()
            cpu.append((c1 - c0) / CALLS / 1e3)
            wall.append((t1 - t0) / CALLS / 1e3)
        settle()
        return {"cpu_us": statistics.median(cpu), "wall_us": statistics.median(wall)}

    def spin(seconds: float) -> None:
        end = perf() + int(seconds * 1e9)
        while perf() < end:
            pass

    def after_idle(fn: Callable[[], Any], wait: Callable[[float], None] = time.sleep) -> dict:
        cpu, wall = [], []
        for _ in range(IDLE):
            settle()
            wait(IDLE_S)
            c0, t0 = thread(), perf()
            fn()
            t1, c1 = perf(), thread()
            cpu.append((c1 - c0) / 1e3)
            wall.append((t1 - t0) / 1e3)
        settle()
        return {"cpu_us": statistics.median(cpu), "wall_us": statistics.median(wall)}

    report: dict[str, Any] = {"rank": rank, "rows": {}, "agree": True}
    for rows in rows_list:
        g = torch.Generator().manual_seed(rows * 31 + rank)
        x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(dev)
        res = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(dev)
        w = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16).to(dev)
        prepared = comm.prepare_fused_allreduce_rmsnorm(x, res, w)
        staged = comm.prepare_fused_allreduce_rmsnorm(x, res, w, stage_input=True)
        ar_prepared = comm.prepare_all_reduce(x)
        calls = {
            "fused plain": lambda: comm.fused_allreduce_rmsnorm(x, res, w),
            "fused prepared": prepared,
            "fused prepared staged": staged,
            "all_reduce plain": lambda: comm.all_reduce(x),
            "all_reduce prepared": ar_prepared,
        }
        plain_digest = _digest(torch, comm.fused_allreduce_rmsnorm(x, res, w))
        ar_digest = _digest(torch, [comm.all_reduce(x)])
        for fn, want in ((prepared, plain_digest), (staged, plain_digest),
                         (ar_prepared, ar_digest)):
            got = fn()
            report["agree"] &= _digest(torch, got if isinstance(got, tuple) else [got]) == want
        case: dict[str, Any] = {}
        for name, fn in calls.items():
            fn()
            settle()
            case[name] = {"path": comm.last_path, "back_to_back": back_to_back(fn),
                          "after_idle": after_idle(fn),
                          "after_idle_busy": after_idle(fn, spin)}
        # the floors: a prepared launch of a local kernel alone, and one small torch op
        k = comm.loader.kernel("add_rmsnorm", T="bf16", H=hidden, FP8=comm.fp8_format)
        o, ro = torch.empty_like(x), torch.empty_like(x)
        go = k.prepare(rows, dict(x=x, residual=res, weight=w, out=o, residual_out=ro, q=0,
                                  scale=0, rows=rows, eps=1e-6, flags=0)).launcher()
        a, b = torch.ones(8, device=dev), torch.empty(8, device=dev)
        for name, fn in (("floor: cuLaunchKernel (local kernel, packed once)", go),
                         ("floor: torch.add(a, 1, out=b)", lambda: torch.add(a, 1, out=b))):
            fn()
            case[name] = {"path": "", "back_to_back": back_to_back(fn),
                          "after_idle": after_idle(fn),
                          "after_idle_busy": after_idle(fn, spin)}
        report["rows"][str(rows)] = case
    settle()
    comm.close()
    dist.destroy_process_group()
    return report


def merge(reports: list[dict]) -> dict:
    """The max over ranks of every median; `agree` over every rank."""
    out: dict[str, Any] = {"agree": all(r["agree"] for r in reports), "rows": {}}
    for rows, case in reports[0]["rows"].items():
        out["rows"][rows] = {}
        for name, first in case.items():
            m = {"path": first["path"]}
            for kind in KINDS:
                m[kind] = {k: max(r["rows"][rows][name][kind][k] for r in reports)
                           for k in ("cpu_us", "wall_us")}
            out["rows"][rows][name] = m
    return out


def table(summary: dict) -> str:
    lines = []
    for tp, res in summary["tp"].items():
        lines.append(f"\nTP{tp} H={summary['hidden']} bf16, max over ranks of each median (us);"
                     f" prepared results equal the plain ones: {res['agree']}")
        lines.append(f"  {'rows':>4} {'call':<50} {'path':<13} {'b2b CPU':>8} {'b2b wall':>8}"
                     f" {'idle CPU':>8} {'idle wall':>9} {'busy CPU':>8} {'busy wall':>9}")
        for rows, case in res["rows"].items():
            for name, m in case.items():
                b, i, k = m["back_to_back"], m["after_idle"], m["after_idle_busy"]
                lines.append(f"  {rows:>4} {name:<50} {m['path']:<13} {b['cpu_us']:8.1f} "
                             f"{b['wall_us']:8.1f} {i['cpu_us']:8.1f} {i['wall_us']:9.1f} "
                             f"{k['cpu_us']:8.1f} {k['wall_us']:9.1f}")
    return "\n".join(lines)


def run(build: str, tps: list[int], hidden: int, rows: list[int], json_path: str | None,
        timeout_s: float = 300.0) -> int:
    summary: dict[str, Any] = {"hidden": hidden, "calls": CALLS, "rounds": ROUNDS,
                               "idle_calls": IDLE, "idle_s": IDLE_S, "tp": {}}
    with rank_env(max(tps)) as env:
        for tp in tps:
            reports = run_ranks([sys.executable, os.path.abspath(__file__), "--build", build,
                                 "--hidden", str(hidden), "--rows", *map(str, rows)], tp, env,
                                timeout_s)
            if reports is None:
                return 1
            summary["tp"][str(tp)] = merge(reports)
    path = json_path or (os.path.join(os.environ["OUT"], "host_cost.json")
                         if os.environ.get("OUT") else "host_cost.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(table(summary), flush=True)
    return 0 if all(res["agree"] for res in summary["tp"].values()) else 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[4])
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 2])
    ap.add_argument("--json", default=None)
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="seconds before every rank of a TP is killed")
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_worker:
        rank, world, port = args.rank_worker
        rep = rank_main(rank, world, port, args.build, args.hidden, args.rows)
        print("REPORT " + json.dumps(rep), flush=True)
        return 0
    return run(args.build, args.tp, args.hidden, args.rows, args.json, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
