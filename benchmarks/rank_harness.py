"""The rank processes every multi-rank GPU benchmark runs: one process per rank, sharing the
GPU under an MPS daemon when there are fewer GPUs than ranks (scripts/gpu_collectives.py
starts and stops it), each rank printing one `REPORT <json>` line.

    with rank_env(max(tps)) as env:
        reports = run_ranks([sys.executable, __file__, ...], tp, env, timeout_s=300)

`run_ranks` adds `--rank-worker RANK WORLD PORT` to the command, waits for every rank within
one deadline (all are killed when it passes) and returns the reports in rank order, or None
(printing the tail of a silent rank's output) when a rank gave none. `graph_time_us` is
how each rank times a call (METHOD.md: a CUDA graph of 20 calls, 30 replays, the median).
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scripts.gpu_collectives import _free_port, start_mps, stop_mps  # noqa: E402


CUSTOM_MAX_BYTES = 64 << 20  # SPEC section 5: above it the entries take the torch fallback


def over_custom_limit(rows: int, hidden: int, elem_bytes: int = 2) -> bool:
    """Whether a rows x hidden call (bf16/fp16) takes the torch fallback, not our kernels:
    the benchmarks skip those shapes (and the harness's gloo group cannot capture them)."""
    return rows * hidden * elem_bytes > CUSTOM_MAX_BYTES


@contextlib.contextmanager
def rank_env(max_tp: int) -> Iterator[dict]:
    """The environment the rank processes run in: MPS's when ranks must share a GPU."""
    import torch
    shared = torch.cuda.device_count() < max_tp
    env = start_mps() if shared else dict(os.environ)
    try:
        yield env
    finally:
        if shared:
            stop_mps(env)


def run_ranks(cmd: list[str], tp: int, env: dict, timeout_s: float) -> list[dict] | None:
    port = _free_port()
    procs = [subprocess.Popen(cmd + ["--rank-worker", str(r), str(tp), str(port)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(tp)]
    deadline = time.monotonic() + timeout_s
    reports = []
    for p in procs:
        killed = False
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            killed = True
        got = [json.loads(line[7:]) for line in out.splitlines() if line.startswith("REPORT ")]
        if not got:
            print(f"TP{tp}: a rank gave no report{' (killed at the timeout)' if killed else ''}"
                  f":\n{out[-3000:]}", flush=True)
            for q in procs:
                q.kill()
            return None
        reports.append(got[0])
    return reports


def replay_median_us(torch, graph, calls: int, replays: int, before=None) -> float:
    """Median us per call over `replays` replays of `graph` (which holds `calls` calls),
    each timed by CUDA events; `before()` runs ahead of each replay (a sync, a reset)."""
    import statistics
    times = []
    for _ in range(replays):
        if before is not None:
            before()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / calls)
    return statistics.median(times)


def rank_communicator(rank: int, world: int, port: int, build: str):
    """(torch, dist, device, Communicator, sync) of one rank process: gloo for the host
    exchange, the rank's GPU (ranks share one under MPS), errors read by the benchmark, a 1 s
    spin limit; `sync()` lines the ranks up before each timed replay."""
    import datetime

    import torch
    import torch.distributed as dist

    from peerdsl.runtime.communicator import Communicator
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    dev = torch.device(f"cuda:{rank % torch.cuda.device_count()}")
    torch.cuda.set_device(dev)
    comm = Communicator(device=dev, build_dir=build, check_errors=False, timeout_s=1.0)
    return torch, dist, dev, comm, dist.barrier


def norm_inputs(torch, rows: int, hidden: int, dev):
    """(x, residual, weight) of a fused call, bf16 on `dev`, drawn from a seed of `rows`: the
    same on every rank (each rank's x differs in real use; the timing does not care)."""
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(dev)
    res = torch.randn(rows, hidden, generator=g).to(torch.bfloat16).to(dev)
    w = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16).to(dev)
    return x, res, w


# a timing: a CUDA graph of CALLS calls, replayed REPLAYS times (METHOD.md)
CALLS, REPLAYS = 20, 30


def graph_time_us(torch, fn, dev, sync=None, capture=None) -> float:
    """Median us per call of fn over REPLAYS replays of a graph of CALLS calls. `capture` is
    the communicator's graph_capture, so captured collectives read their inputs in place
    (registered after the capture), as in a serving engine's graphs."""
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream(dev).wait_stream(s)
    torch.cuda.synchronize(dev)
    g = torch.cuda.CUDAGraph()
    with capture() if capture else contextlib.nullcontext():
        with torch.cuda.graph(g, stream=s):
            for _ in range(CALLS):
                fn()

    def before() -> None:
        if sync:
            sync()
        torch.cuda.synchronize(dev)
    return replay_median_us(torch, g, CALLS, REPLAYS, before)
