"""Every built one-/two-stage all-reduce variant timed side by side (issue 15 item 1).

    PYTHONPATH=. python3 benchmarks/bench_ar_rms.py --ar-variants --build build --tp 2 4
    PYTHONPATH=. python3 benchmarks/bench_ar_variants.py --build build --tp 2 4   # the same

For TP2 and TP4 at rows 1,16,64,256,384,1024,2048,4096 (H=6144 bf16), in one run under the
multi-process MPS harness of bench_ar_rms.py, with CUDA graphs (20 calls per graph, 30
replays, median per rank, max over ranks, us per call): the dispatch's own choice
("default"), LL where it fits, and every variant of the sm_90 manifest for the world size:
path 1stage / 2stage, U (packs per thread per iteration, or "auto": dispatch's rule), B
(threads per block), E (two-stage end barrier), and a halved grid for a few. Each config's
eager result is checked bitwise against the rank-order reference first; a config that
fails, or whose spin expires, is recorded with its error and the ranks rebuild their
communicator. Bounded: a time budget per TP (--budget-s; configs past it are skipped on
every rank alike), a 1 s spin limit, and a wall timeout per TP after which the rank
processes are killed. Writes $OUT/ar_variants.json (or --json) and a Markdown table beside it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROWS = [1, 16, 64, 256, 384, 1024, 2048, 4096]
CALLS, REPLAYS = 20, 30
# vLLM custom all-reduce, best of its one-/two-stage kernels, same harness (MPS, one H200),
# us per call, from ../shared/BASELINES.md "Peers side by side" (2026-12-03): for the ratio
VLLM_US = {2: {1: 4.7, 16: 4.5, 64: 6.3, 256: 9.0, 384: 9.7, 1024: 34.8, 2048: 63.4,
               4096: 118.2},
           4: {1: 9.1, 16: 9.4, 64: 11.7, 256: 16.5, 384: 23.5, 1024: 48.1, 2048: 85.1,
               4096: 152.9}}
AR_ENV = ("PEERDSL_LL_MAX_BYTES", "PEERDSL_TWO_STAGE_MIN_WORLD", "PEERDSL_TWO_STAGE_MIN_BYTES",
          "PEERDSL_AR_UNROLL", "PEERDSL_AR_BLOCK", "PEERDSL_AR_END_BARRIER")


# ----------------------------------------------------------------------------- pure part

def configs(built: list[dict], world: int, table: dict | None, quick: bool = False
            ) -> list[dict]:
    """What to time for `world`: `built` holds the manifest's constexprs of allreduce_1stage
    / allreduce_2stage ({"op", "W", "U", "B", "E"}, bf16 only); `table` is
    dispatch.AR_KERNELS[arch] (path -> world -> ArKernel) or None."""
    out = [{"name": "default", "path": None}, {"name": "ll", "path": "ll"}]
    for path in ("1stage", "2stage"):
        mine = sorted({(c["U"], c["B"], c.get("E")) for c in built
                       if c["op"] == f"allreduce_{path}" and c["W"] == world})
        choice = (table or {}).get(path, {}).get(world)
        if choice is not None:
            e = choice.end_barrier if path == "2stage" else None
            out.append(_cfg(path, "auto", choice.block, e))
            out.append(_cfg(path, "auto", choice.block, e, grid="half"))
        for U, B, E in mine:
            if path == "2stage" and E == 1 and not (U == 1 and B == 256) and not (
                    choice is not None and B == choice.block and U == choice.max_unroll):
                continue  # the end barrier's cost: the old shape and the table's choice
            if quick and not (U == 1 and B == 256) and not (
                    choice is not None and B == choice.block):
                continue
            out.append(_cfg(path, U, B, E))
        out.append(_cfg(path, 1, 256, None if path == "1stage" else 0, grid="half"))
    return [c for c in out if c["path"] in (None, "ll") or _is_built(c, built, world)]


def _cfg(path: str, U, B: int, E, grid: str | None = None) -> dict:
    name = f"{path} U={U} B={B}" + ("" if E is None else f" E={E}") + (
        f" grid={grid}" if grid else "")
    return {"name": name, "path": path, "U": U, "B": B, "E": E, "grid": grid}


def _is_built(c: dict, built: list[dict], world: int) -> bool:
    op = f"allreduce_{c['path']}"
    return any(b["op"] == op and b["W"] == world and b["B"] == c["B"]
               and (c["U"] == "auto" or b["U"] == c["U"]) and b.get("E") == c["E"]
               for b in built)


def env_for(cfg: dict, ll_capacity: int) -> dict[str, str]:
    """The PEERDSL_* settings that send comm.all_reduce to `cfg` (every other AR_ENV unset)."""
    path = cfg["path"]
    if path is None:
        return {}
    if path == "ll":
        return {"PEERDSL_LL_MAX_BYTES": str(ll_capacity)}
    env = {"PEERDSL_LL_MAX_BYTES": "0", "PEERDSL_AR_BLOCK": str(cfg["B"]),
           "PEERDSL_TWO_STAGE_MIN_WORLD": "2" if path == "2stage" else "99",
           "PEERDSL_TWO_STAGE_MIN_BYTES": "0"}
    if cfg["U"] != "auto":
        env["PEERDSL_AR_UNROLL"] = str(cfg["U"])
    if cfg["E"] is not None:
        env["PEERDSL_AR_END_BARRIER"] = str(cfg["E"])
    return env


def merge(reps: list[dict]) -> dict:
    """Max over ranks of each (rows, config) median; the first non-ok status wins."""
    out = {"rows": {}}
    for key, per_cfg in reps[0]["rows"].items():
        out["rows"][key] = {}
        for name, first in per_cfg.items():
            cells = [r["rows"][key][name] for r in reps]
            bad = [c["status"] for c in cells if c["status"] != "ok"]
            cell = dict(first, status=bad[0] if bad else "ok")
            if not bad:
                cell["us"] = max(c["us"] for c in cells)
            out["rows"][key][name] = cell
    out["configs"] = reps[0]["configs"]
    return out


def best(cells: dict, prefix: str = "") -> tuple[str, float] | None:
    ok = [(c["us"], n) for n, c in cells.items() if c["status"] == "ok" and n.startswith(prefix)
          and n != "default"]
    return (min(ok)[1], min(ok)[0]) if ok else None


def report(summary: dict) -> str:
    lines = []
    for tp in sorted(k for k in summary if k.startswith("tp")):
        world, s = int(tp[2:]), summary[tp]
        rows = sorted(int(k) for k in s["rows"])
        lines += [f"\nTP{world}, H={summary['hidden']} bf16, us per call (graph of {CALLS} calls, "
                  f"median of {REPLAYS} replays per rank, max over ranks)",
                  "| rows | MiB | default (what dispatch sends) | best config | best 1stage | "
                  "best 2stage | LL | vLLM 2026-12-03 | vLLM / best |", "|---" * 9 + "|"]
        for r in rows:
            cells = s["rows"][str(r)]
            d = cells.get("default", {})
            dflt = (f"{d['us']:.1f} ({d.get('kernel', '')})" if d.get("status") == "ok"
                    else d.get("status", "-"))
            b, b1, b2 = best(cells), best(cells, "1stage"), best(cells, "2stage")
            ll = cells.get("ll", {})
            v = VLLM_US.get(world, {}).get(r)
            out = [str(r), f"{r * summary['hidden'] * 2 / 2**20:.2f}", dflt]
            out += [f"{x[1]:.1f} ({x[0]})" if x else "-" for x in (b, b1, b2)]
            out.append(f"{ll['us']:.1f}" if ll.get("status") == "ok" else "-")
            out += [str(v), f"{v / b[1]:.2f}"] if v and b else ["-", "-"]
            lines.append("| " + " | ".join(out) + " |")
        lines += [f"\nTP{world}, every config (us; blank: not valid for the size, e.g. LL past "
                  "its scratch or two-stage past the staging)",
                  "| config | blocks/SM | " + " | ".join(map(str, rows)) + " |",
                  "|---" * (len(rows) + 2) + "|"]
        for name in s["configs"]:
            cells = [s["rows"][str(r)].get(name, {}) for r in rows]
            occ = next((c["blocks_per_sm"] for c in cells if c.get("blocks_per_sm")), "-")
            txt = [f"{c['us']:.1f}" if c.get("status") == "ok" else
                   ("" if c.get("status", "").startswith("n/a") else "ERR") for c in cells]
            lines.append(f"| {name} | {occ} | " + " | ".join(txt) + " |")
        errs = {(r, n): c["status"] for r in rows for n, c in s["rows"][str(r)].items()
                if c["status"] not in ("ok",) and not c["status"].startswith("n/a")}
        for (r, n), st in list(errs.items())[:12]:
            lines.append(f"- rows {r}, {n}: {st}")
        lines.append(recommend(summary, tp))
    return "\n".join(lines)


def recommend(summary: dict, tp: str) -> str:
    """The one- vs two-stage crossover (runtime/thresholds.py two_stage_min_bytes) and each path's
    fastest (U, B, E) per row count, as measured."""
    s, hidden = summary[tp], summary["hidden"]
    rows = sorted(int(k) for k in s["rows"])
    two_wins = [r for r in rows if (b1 := best(s["rows"][str(r)], "1stage"))
                and (b2 := best(s["rows"][str(r)], "2stage")) and b2[1] < b1[1]]
    tail = [r for r in rows if all(x in two_wins for x in rows if x >= r)]
    cross = (f"two-stage wins from {tail[0]} rows ({tail[0] * hidden * 2} bytes): "
             f"PEERDSL_TWO_STAGE_MIN_BYTES={tail[0] * hidden * 2}" if tail and two_wins
             else "one-stage wins (or ties) at the largest rows: keep two-stage off")
    per = "; ".join(f"{r}: {b[0]}" for r in rows if (b := best(s["rows"][str(r)])))
    return f"\n{tp} recommendation: {cross}. Fastest per rows: {per}"


# ----------------------------------------------------------------------------- the GPU part

def _agree(dist, ok: bool) -> bool:
    """All ranks' verdict (every rank calls this at the same points)."""
    got = [None] * dist.get_world_size()
    dist.all_gather_object(got, bool(ok))
    return all(got)


def _time_graph(torch, fn, dev, stream, sync, capture) -> float:
    g = torch.cuda.CUDAGraph()
    with capture():
        with torch.cuda.graph(g, stream=stream):
            for _ in range(CALLS):
                fn()
    from benchmarks.rank_harness import replay_median_us

    def before() -> None:
        sync()
        torch.cuda.synchronize(dev)
    us = replay_median_us(torch, g, CALLS, REPLAYS, before)
    del g
    return us


@contextlib.contextmanager
def _settings(comm, cfg: dict, ll_capacity: int):
    saved = {k: os.environ.pop(k, None) for k in AR_ENV}
    grid = comm.max_grid
    os.environ.update(env_for(cfg, ll_capacity))
    if cfg.get("grid") == "half":
        comm.max_grid = max(1, grid // 2)
    try:
        yield
    finally:
        comm.max_grid = grid
        for k in AR_ENV:
            os.environ.pop(k, None)
        os.environ.update({k: v for k, v in saved.items() if v is not None})


def _kernel_facts(comm, torch, x) -> dict:
    """The kernel the last all_reduce launched: constexprs, grid, blocks per SM."""
    from peerdsl.runtime import dispatch
    from peerdsl.runtime.cuda._driver import check, driver
    path, world = comm.last_path, comm.world
    packs = x.numel() * x.element_size() // 16
    if path == "ll":
        name, cx, grid = "allreduce_ll", {"T": "bf16", "W": world}, comm._grid(packs)
    else:
        work = packs // world if path == "2stage" else packs
        cx, per_block = dispatch.ar_kernel(comm.arch, path, world, work, comm.max_grid)
        name, cx, grid = f"allreduce_{path}", {"T": "bf16", "W": world, **cx}, comm._grid(
            work, per_block)
    k = comm.loader.kernel(name, **cx)
    per_sm = int(check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        k.function, k.entry.block_size, k.entry.dynamic_lds_bytes), "occupancy"))
    grid = min(grid, comm._resident_cap(k))
    short = " ".join(f"{a}={b}" for a, b in cx.items() if a not in ("T", "W"))
    return {"kernel": f"{path} {short}".strip(), "grid": grid, "blocks_per_sm": per_sm,
            "registers": k.entry.resources.get("registers")}


def _measure(comm, make, cfg, cell, x, ref, dist, torch, dev, stream, ll_cap):
    """Time one (config, rows) cell on every rank; returns the communicator to go on with
    (a new one when a call failed or a spin expired on any rank)."""
    sync = lambda: dist.barrier()  # noqa: E731 - ranks start each replay together
    with _settings(comm, cfg, ll_cap):
        try:  # phase A: one eager call on the capture stream, checked bitwise
            stream.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(stream):
                y = comm.all_reduce(x)
            torch.cuda.current_stream(dev).wait_stream(stream)
            want = cfg["path"] or comm.last_path
            if comm.last_path != want:
                cell["status"] = f"n/a (path {comm.last_path})"
            elif not torch.equal(y.view(torch.int16), ref.view(torch.int16)):
                cell["status"] = "wrong result"
            else:
                cell.update(_kernel_facts(comm, torch, x))
            comm.check_errors()
        except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
            cell["status"] = f"error: {type(e).__name__}: {e}"[:300]
        if _agree(dist, cell["status"] == "ok"):  # phase B: the graph, every rank or none
            try:
                cell["us"] = _time_graph(torch, lambda: comm.all_reduce(x), dev, stream,
                                         sync, comm.graph_capture)
                comm.check_errors()
            except Exception as e:  # noqa: BLE001
                cell["status"] = f"error: {type(e).__name__}: {e}"[:300]
                cell.pop("us", None)
    if _agree(dist, cell["status"] == "ok" or cell["status"].startswith("n/a")):
        comm.release_graph_buffers()
        return comm
    with contextlib.suppress(Exception):  # every rank starts afresh
        comm.close()
    return make()


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace) -> dict:
    import datetime

    import torch
    import torch.distributed as dist

    from peerdsl.runtime import dispatch
    from peerdsl.runtime.communicator import Communicator
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    torch.cuda.set_device(dev)
    make = lambda: Communicator(device=dev, build_dir=args.build, check_errors=False,  # noqa
                                timeout_s=1.0)
    comm = make()
    built = [dict(e.constexprs, op=e.op) for e in comm.loader.manifest.kernels.values()
             if e.op in ("allreduce_1stage", "allreduce_2stage")
             and e.constexprs.get("T") == "bf16"]
    cfgs = configs(built, world, dispatch.AR_KERNELS.get(comm.arch), args.quick)
    ll_cap = comm.meta_layout.ll_max_bytes
    stream = torch.cuda.Stream(dev)
    deadline = time.monotonic() + args.budget_s
    result = {"configs": [c["name"] for c in cfgs],
              "rows": {str(r): {} for r in args.rows}}
    data = {}
    for rows in args.rows:  # every rank's input (seeded), this rank's, and the reference
        xs = [(torch.randn(rows, args.hidden, generator=torch.Generator().manual_seed(
            rows * 131 + r)) * (r + 1)).to(torch.bfloat16) for r in range(world)]
        ref = xs[0].float()
        for other in xs[1:]:
            ref = ref + other.float()
        data[rows] = (xs[rank].to(dev), ref.to(torch.bfloat16).to(dev))
    for cfg in cfgs:  # configs outside: one past the budget loses every row count alike
        go = _agree(dist, time.monotonic() < deadline)
        for rows in args.rows:
            cell = result["rows"][str(rows)][cfg["name"]] = {"status": "ok"}
            if not go:
                cell["status"] = "n/a (time budget spent)"
                continue
            comm = _measure(comm, make, cfg, cell, *data[rows], dist, torch, dev, stream,
                            ll_cap)
    torch.cuda.synchronize(dev)
    dist.barrier()
    comm.close()
    return result


def run_tp(tp: int, args: argparse.Namespace, env: dict) -> dict | None:
    from benchmarks.rank_harness import run_ranks
    cmd = [sys.executable, os.path.abspath(__file__), "--build", args.build, "--hidden",
           str(args.hidden), "--budget-s", str(args.budget_s), "--rows", *map(str, args.rows)]
    cmd += ["--quick"] if args.quick else []
    # start-up, the last config past the budget, a rebuild
    reps = run_ranks(cmd, tp, env, timeout_s=args.budget_s + 120)
    return None if reps is None else merge(reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS)
    ap.add_argument("--budget-s", type=float, default=90.0,
                    help="seconds of timing per TP; configs past it are skipped")
    ap.add_argument("--quick", action="store_true", help="fewer (U, B): the table's B and 256")
    ap.add_argument("--json", default=None)
    ap.add_argument("--report", metavar="JSON", help="print the tables of a saved run")
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.report:
        with open(args.report) as f:
            print(report(json.load(f)))
        return 0
    if args.rank_worker:
        rank, world, port = args.rank_worker
        print("REPORT " + json.dumps(rank_main(rank, world, port, args)), flush=True)
        return 0
    from benchmarks.rank_harness import rank_env
    summary: dict = {"hidden": args.hidden, "calls": CALLS, "replays": REPLAYS}
    t0 = time.monotonic()
    with rank_env(max(args.tp)) as env:
        for tp in args.tp:
            got = run_tp(tp, args, env)
            if got is not None:
                summary[f"tp{tp}"] = got
            print(f"TP{tp} done at {time.monotonic() - t0:.0f} s", flush=True)
    path = args.json or os.path.join(os.environ.get("OUT", "."), "ar_variants.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    text = report(summary)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(text + "\n")
    print(text)
    return 0 if all(f"tp{tp}" in summary for tp in args.tp) else 1


if __name__ == "__main__":
    sys.exit(main())
