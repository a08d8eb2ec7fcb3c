"""Issue 5's proof on a GPU machine: one process per rank, an MPS daemon started and stopped
here, TP2 and TP4 on however many GPUs there are (ranks share a GPU when there are fewer).

    python3 scripts/gpu_collectives.py --build build --tp 2 4 [--steps 300] [--replays 1000]

Checks, per TP: SPEC section 7's shapes in bf16 and fp16, eager and graph replay, with and
without FP8 and gemma: every rank bitwise identical and equal to the unfused path; 1000
graph replays stay correct; the interleave test with a different GPU-side delay per rank
every step; a missing rank makes the others raise CollectiveTimeout within the bound.
`--faults` adds issue 14's runtime fault cases (scripts/gpu_faults.py: a rank skipping a call,
bad input on one rank, disagreeing rows, a rank delayed past the spin limit, epochs near the
2^31 / 2^32 wraps, calls after close()); `--faults-only` runs just those.
Writes a JSON summary to $OUT/gpu_collectives.json (or --json).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# (101, 2880) at TP2: the fused one-stage kernel with two rows per block iteration (more
# rows than the 66 blocks of a rank under MPS), the last iteration partial; at TP4 (100,
# 2880) takes the plain one-stage kernel with more rows than its 33 blocks, (64, 6144) and
# (256, 6144) the two-stage kernel with one row in flight, (201, 2880) its split form
SHAPES = {4: [(16, 6144), (4, 2880), (64, 6144), (100, 2880), (201, 2880), (256, 6144),
              (384, 6144), (1024, 6144),
              (2730, 6144), (2800, 6144), (5400, 6144), (1024, 7168), (512, 8192),
              (1024, 4096), (1024, 2880)],
          2: [(16, 6144), (101, 2880), (384, 6144), (1024, 6144), (1024, 4096), (1024, 2880),
              (512, 8192)]}
OPTIONS = [{}, {"gemma_norm": True}, {"fp8_out": True}, {"fp8_out": True, "bf16_mirror": True,
                                                         "gemma_norm": True}]


def _digest(ts) -> str:
    h = hashlib.sha256()
    for t in ts:
        h.update(t.contiguous().view(-1).view(__import__("torch").uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def _inputs(torch, world, rows, hidden, dtype, seed, device):
    g = torch.Generator(device="cpu").manual_seed(seed)
    xs = [torch.randn(rows, hidden, generator=g).to(dtype) for _ in range(world)]
    res = torch.randn(rows, hidden, generator=g).to(dtype)
    w = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    return [x.to(device) for x in xs], res.to(device), w.to(device)


def _fused(comm, x, res, w, path, **opt):
    os.environ["PEERDSL_FUSED_PATH"] = path
    try:
        return [t.clone() for t in comm.fused_allreduce_rmsnorm(x, res, w, **opt)]
    finally:
        os.environ.pop("PEERDSL_FUSED_PATH", None)


def rank_main(rank: int, world: int, port: int, build: str, steps: int, replays: int,
              allocator: str = "ipc", faults: str = "no") -> dict:
    import torch
    import torch.distributed as dist
    from peerdsl.runtime.communicator import Communicator
    from peerdsl.runtime.errors import CollectiveTimeout

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    torch.cuda.set_device(dev)
    if faults == "only":
        return _with_faults({"rank": rank, "checks": 0, "failures": []}, rank, world, build,
                            dev, allocator, dist)
    comm = Communicator(device=dev, build_dir=build, timeout_s=2.0, allocator=allocator)
    report: dict = {"rank": rank, "arch": comm.arch, "allocator": allocator, "checks": 0,
                    "failures": []}

    def agree(tag, ts):
        digests = [None] * world
        dist.all_gather_object(digests, _digest(ts))
        if len(set(digests)) != 1:
            report["failures"].append(f"{tag}: ranks differ")

    def same(tag, a, b):
        report["checks"] += 1
        for i, (p, q) in enumerate(zip(a, b)):
            if not torch.equal(p.view(torch.uint8), q.view(torch.uint8)):
                report["failures"].append(f"{tag}: output {i} differs")
                return

    t0 = time.time()
    for rows, hidden in SHAPES[world]:
        for dtype in (torch.bfloat16, torch.float16):
            xs, res, w = _inputs(torch, world, rows, hidden, dtype, rows + hidden, dev)
            for opt in OPTIONS:
                tag = f"{rows}x{hidden} {dtype} {opt}"
                got = [t.clone() for t in comm.fused_allreduce_rmsnorm(xs[rank], res, w, **opt)]
                path = comm.last_path
                base = _fused(comm, xs[rank], res, w, "unfused", **opt)
                same(f"{tag} {path} vs unfused", got, base)
                agree(f"{tag} {path}", got)
                # graph capture of the same call, replayed
                static_x = xs[rank].clone()
                stream = torch.cuda.Stream(dev)
                stream.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(stream):
                    comm.fused_allreduce_rmsnorm(static_x, res, w, **opt)  # warm up
                torch.cuda.current_stream(dev).wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with comm.graph_capture(), torch.cuda.graph(graph, stream=stream):
                    outs = comm.fused_allreduce_rmsnorm(static_x, res, w, **opt)
                graph.replay()
                torch.cuda.synchronize(dev)
                same(f"{tag} graph vs eager", list(outs), got)
    report["shapes_s"] = round(time.time() - t0, 1)

    # 1000 replays alternating two inputs
    xs_a, res, w = _inputs(torch, world, 384, 6144, torch.bfloat16, 1, dev)
    xs_b, _, _ = _inputs(torch, world, 384, 6144, torch.bfloat16, 2, dev)
    want_a = [t.clone() for t in comm.fused_allreduce_rmsnorm(xs_a[rank], res, w)]
    want_b = [t.clone() for t in comm.fused_allreduce_rmsnorm(xs_b[rank], res, w)]
    static_x = xs_a[rank].clone()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(dev)
    with comm.graph_capture(), torch.cuda.graph(graph, stream=stream):
        outs = comm.fused_allreduce_rmsnorm(static_x, res, w)
    bad = 0
    for i in range(replays):
        src, want = (xs_a, want_a) if i % 2 == 0 else (xs_b, want_b)
        static_x.copy_(src[rank])
        graph.replay()
        bad += sum(not torch.equal(o, e) for o, e in zip(outs, want))
    torch.cuda.synchronize(dev)
    comm.check_errors("graph replays")
    report["replays"], report["replay_mismatches"] = replays, int(bad)
    if bad:
        report["failures"].append(f"{bad} mismatches over {replays} replays")
    # the graph is dropped, its buffers released on every rank, and a re-capture reuses rows
    del graph
    comm.release_graph_buffers()
    graph = torch.cuda.CUDAGraph()
    with comm.graph_capture(), torch.cuda.graph(graph, stream=stream):
        outs = comm.fused_allreduce_rmsnorm(static_x, res, w)
    static_x.copy_(xs_b[rank])
    graph.replay()
    torch.cuda.synchronize(dev)
    report["checks"] += 1
    report["rows_after_release"] = comm.tables.next_row
    if comm.tables.next_row != 2 or not all(torch.equal(o, e) for o, e in zip(outs, want_b)):
        report["failures"].append("re-capture after release_graph_buffers")

    # interleave with GPU-side per-rank delays
    from peerdsl.ops.gpu_delay import gpu_delay  # noqa: F401 (registered op)
    sink = torch.zeros(1, dtype=torch.int32, device=dev)
    delay = comm.loader.kernel("gpu_delay")
    rng = torch.Generator().manual_seed(1234)
    t0 = time.time()
    for step in range(steps):
        rows = 384 if step % 2 == 0 else 1024
        xs, res, w = _inputs(torch, world, rows, 6144, torch.bfloat16, 10_000 + step, dev)
        tiny = [x[:1].reshape(-1)[:2048].contiguous() for x in xs]
        big = [x.reshape(-1).contiguous() for x in xs]
        for call in range(4):
            ns = int(torch.randint(0, 200_000, (world,), generator=rng)[rank])
            delay.launch(1, {"sink": sink, "nanoseconds": ns})
            if call == 0:
                out, res_out = comm.fused_allreduce_rmsnorm(xs[rank], res, w)
                ar = sum(x.float() for x in xs).to(torch.bfloat16)  # left-to-right: rank order
                ok = torch.equal(res_out, (ar.float() + res.float()).to(torch.bfloat16))
            elif call == 1:
                ok = torch.equal(comm.all_reduce(tiny[rank]),
                                 sum(t.float() for t in tiny).to(torch.bfloat16))
            elif call == 2:
                ok = torch.equal(comm.all_reduce(big[rank]),
                                 sum(t.float() for t in big).to(torch.bfloat16))
            else:
                ok = torch.equal(comm.all_gather(tiny[rank]), torch.stack(tiny))
            report["checks"] += 1
            if not ok:
                report["failures"].append(f"interleave step {step} call {call}")
    report["interleave_steps"], report["interleave_s"] = steps, round(time.time() - t0, 1)

    # a rank that never arrives: the last rank skips one all-reduce
    comm.set_timeout(0.5)
    x = torch.ones(4096, dtype=torch.bfloat16, device=dev)
    t0 = time.time()
    if rank == world - 1:
        report["timeout"] = "skipped the call"
    else:
        try:
            os.environ["PEERDSL_LL_MAX_BYTES"] = "0"  # the one-stage kernel: a Signal barrier
            comm.all_reduce(x)
            report["failures"].append("missing rank: no CollectiveTimeout")
        except CollectiveTimeout as e:
            report["timeout"] = f"{e} after {time.time() - t0:.2f} s"
        finally:
            os.environ.pop("PEERDSL_LL_MAX_BYTES", None)
    torch.cuda.synchronize(dev)
    dist.barrier()
    comm.close()
    if faults == "yes":
        return _with_faults(report, rank, world, build, dev, allocator, dist)
    dist.destroy_process_group()
    return report


def _with_faults(report: dict, rank: int, world: int, build: str, dev, allocator: str,
                 dist) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_faults import run_faults
    t0 = time.time()
    rep = run_faults(rank, world, build, dev, allocator)
    report["faults"] = {k: rep[k] for k in ("cases", "calls", "exact", "errors", "corruptions")}
    report["faults"]["s"] = round(time.time() - t0, 1)
    report["failures"] += [f"faults: {f}" for f in rep["failures"]]
    report["checks"] += rep["calls"]
    dist.barrier()
    dist.destroy_process_group()
    return report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mps() -> dict:
    d = tempfile.mkdtemp(prefix="mps")
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(d, "pipe"),
               CUDA_MPS_LOG_DIRECTORY=os.path.join(d, "log"))
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    return env


def stop_mps(env: dict) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env, check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--replays", type=int, default=1000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--allocator", choices=["ipc", "vmm"], default="ipc",
                    help="peer memory: CUDA IPC handles (default) or cuMemCreate + fd passing")
    ap.add_argument("--faults", action="store_true", help="also run issue 14's fault cases")
    ap.add_argument("--faults-only", action="store_true", help="run only the fault cases")
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    faults = "only" if args.faults_only else "yes" if args.faults else "no"
    if args.rank_worker:
        rank, world, port = args.rank_worker
        rep = rank_main(rank, world, port, args.build, args.steps, args.replays, args.allocator,
                        faults)
        print("REPORT " + json.dumps(rep), flush=True)
        return 0
    import torch
    # ranks share a GPU only when there are fewer GPUs than ranks: then MPS runs them together
    shared = torch.cuda.device_count() < max(args.tp)
    env = start_mps() if shared else dict(os.environ)
    summary = {}
    try:
        for tp in args.tp:
            port = _free_port()
            procs = [subprocess.Popen([sys.executable, __file__, "--build", args.build,
                                       "--allocator", args.allocator,
                                       "--steps", str(args.steps), "--replays",
                                       str(args.replays), "--rank-worker", str(r), str(tp),
                                       str(port)] + {"yes": ["--faults"], "only": [
                                           "--faults-only"], "no": []}[faults],
                                      env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
                     for r in range(tp)]
            reports = []
            for p in procs:
                out, _ = p.communicate(timeout=1500)
                reps = [json.loads(line[7:]) for line in out.splitlines()
                        if line.startswith("REPORT ")]
                reports.append(reps[0] if reps else {"failures": ["rank crashed"],
                                                     "log": out[-3000:]})
            summary[f"tp{tp}"] = reports
            ok = all(not r.get("failures") for r in reports)
            print(f"TP{tp}: {'PASS' if ok else 'FAIL'} "
                  f"{sum(r.get('checks', 0) for r in reports)} checks; "
                  + json.dumps(reports[0])[:1500], flush=True)
    finally:
        if shared:
            stop_mps(env)
    path = args.json or (os.path.join(os.environ["OUT"], "gpu_collectives.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if all(not r.get("failures") for reps in summary.values() for r in reps) else 1


if __name__ == "__main__":
    sys.exit(main())
