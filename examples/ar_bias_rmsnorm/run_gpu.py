"""Step 5 of the tutorial: ar_bias_rmsnorm on the GPU, one process per rank (ranks share the
H200 under an MPS daemon started here, as scripts/gpu_collectives.py does).

    peerdsl build --arch sm_90 --module examples/ar_bias_rmsnorm/ar_bias_rmsnorm.py -o build
    PYTHONPATH=. python3 examples/ar_bias_rmsnorm/run_gpu.py --build build --tp 2 4

Every rank, for each hidden size and row count: the fused op and the unfused chain (shipped
all-reduce, + bias in torch, shipped add + RMSNorm) on the same inputs. Checks, on every
rank: fused == the exact torch reference and == the unfused chain, byte for byte, eager and
after CUDA graph replays. Times both the project's way (benchmarks/bench_ar_rms.py: a CUDA
graph of 20 calls, 30 replays, median us per call; max over ranks). Writes
$OUT/ar_bias_rmsnorm_gpu.json (or --json).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..")]
import ar_bias_rmsnorm_host as host  # noqa: E402
import ar_bias_rmsnorm_ref as ref  # noqa: E402

ROWS = [1, 16, 64, 256, 1024, 4096]


def rank_main(rank: int, world: int, port: int, build: str, hidden: list[int],
              rows_list: list[int]) -> dict:
    import torch
    import torch.distributed as dist

    from benchmarks.rank_harness import graph_time_us
    from peerdsl import Communicator

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    torch.cuda.set_device(dev)
    comm = Communicator(device=dev, build_dir=build, timeout_s=2.0)
    report: dict = {"rank": rank, "checks": 0, "failures": [], "us": {}}

    def same(tag: str, got, want) -> None:
        report["checks"] += 1
        if not ref.same_bytes(got.cpu(), want.cpu()):
            report["failures"].append(tag)

    sync = lambda: (torch.cuda.synchronize(dev), dist.barrier())  # noqa: E731
    for H in hidden:
        for rows in rows_list:
            xs, residuals, bias, weight = ref.make_inputs(world, rows, H, torch.bfloat16,
                                                          seed=rows + H)
            x, res, b, w = (t.to(dev) for t in (xs[rank], residuals[rank], bias, weight))
            # the reference sums squares in the order of the variant the launch runs
            built = comm.launch_constexprs(host.OP, {"T": torch.bfloat16, "H": H, "W": world})
            want = ref.exact(xs, bias, residuals[rank], weight, block=built["B"])
            fused = host.ar_bias_rmsnorm(comm, x, b, res, w)
            unfused = host.unfused(comm, x, b, res, w)
            tag = f"H={H} rows={rows}"
            for i, name in enumerate(("out", "residual_out")):
                same(f"{tag} {name}: fused vs exact", fused[i], want[i])
                same(f"{tag} {name}: fused vs unfused", fused[i], unfused[i])
            last: dict = {}  # the outputs of the graph's last call, refreshed by every replay
            t_fused = graph_time_us(
                torch, lambda: last.__setitem__("f", host.ar_bias_rmsnorm(comm, x, b, res, w)),
                dev, sync, comm.graph_capture)
            t_unfused = graph_time_us(
                torch, lambda: last.__setitem__("u", host.unfused(comm, x, b, res, w)),
                dev, sync, comm.graph_capture)
            comm.check_errors("ar_bias_rmsnorm graph replays")
            for i, name in enumerate(("out", "residual_out")):
                same(f"{tag} {name}: fused graph replay vs exact", last["f"][i], want[i])
                same(f"{tag} {name}: unfused graph replay vs exact", last["u"][i], want[i])
            report["us"][tag] = {"fused": t_fused, "unfused": t_unfused}
    dist.barrier()
    comm.close()
    dist.destroy_process_group()
    return report


def table(reports: list[dict]) -> str:
    """Max over ranks of each rank's median, per shape."""
    lines = ["| shape | fused us | unfused us (all-reduce, + bias, add+RMSNorm) | unfused/fused |",
             "|---|---|---|---|"]
    for tag in reports[0]["us"]:
        f = max(r["us"][tag]["fused"] for r in reports)
        u = max(r["us"][tag]["unfused"] for r in reports)
        lines.append(f"| {tag} | {f:.1f} | {u:.1f} | {u / f:.2f}x |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, nargs="+", default=[6144])
    ap.add_argument("--rows", type=int, nargs="+", default=ROWS)
    ap.add_argument("--json", default=None)
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rank_worker:
        rank, world, port = a.rank_worker
        print("REPORT " + json.dumps(rank_main(rank, world, port, a.build, a.hidden, a.rows)),
              flush=True)
        return 0
    import torch

    from scripts.gpu_collectives import _free_port, start_mps, stop_mps
    shared = torch.cuda.device_count() < max(a.tp)  # ranks share a GPU: run them under MPS
    env = start_mps() if shared else dict(os.environ)
    summary, ok = {}, True
    try:
        for tp in a.tp:
            port = _free_port()
            cmd = [sys.executable, __file__, "--build", a.build, "--hidden", *map(str, a.hidden),
                   "--rows", *map(str, a.rows), "--rank-worker"]
            procs = [subprocess.Popen(cmd + [str(r), str(tp), str(port)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                     for r in range(tp)]
            reports = []
            for p in procs:
                out, _ = p.communicate(timeout=1200)
                got = [json.loads(ln[7:]) for ln in out.splitlines() if ln.startswith("REPORT ")]
                reports.append(got[0] if got else {"failures": ["rank crashed"], "us": {},
                                                   "log": out[-3000:]})
            summary[f"tp{tp}"] = reports
            failures = [f for r in reports for f in r["failures"]]
            ok = ok and not failures
            print(f"TP{tp}: {'PASS' if not failures else 'FAIL'} "
                  f"{sum(r.get('checks', 0) for r in reports)} checks, {len(failures)} failures")
            for f in failures[:20]:
                print("  " + f)
            if not failures:
                print(table(reports))
            else:
                print(reports[0].get("log", ""))
    finally:
        if shared:
            stop_mps(env)
    path = a.json or (os.path.join(os.environ["OUT"], "ar_bias_rmsnorm_gpu.json")
                      if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
