"""SPEC section 8's table on a GPU machine, with the floors and single-GPU peers, in one run.

    python3 benchmarks/bench_ar_rms.py --build build --tp 2 4 --hidden 6144 2880 8192

Method (METHOD.md): CUDA graph of 20 calls, 30 replays, median per rank, max over ranks,
us per call. Ranks are processes (one GPU each, or sharing one GPU under an MPS daemon
started here). In the same run: the copy bandwidth (device-to-device, read + write), the
null collective (a launch + one Signal barrier), torch eager / torch.compile / a Triton
add + RMSNorm of our own, and our add + RMSNorm and FP8 quant kernels beside them, and the
host-side cost of one eager fused call. Writes $OUT/bench.json (or --json) and a PNG plot.

    python3 benchmarks/bench_ar_rms.py --ar-variants --build build --tp 2 4

times every built one-/two-stage all-reduce variant instead (benchmarks/bench_ar_variants.py,
which takes the same --build/--tp and its own options).

`--host-cost` measures only the host cost of one eager call, plain and prepared
(benchmarks/host_cost_gpu.py).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.bench_report import merge, plot, report  # noqa: E402
from benchmarks.forced_paths import forced_paths  # noqa: E402
from benchmarks.rank_harness import (CUSTOM_MAX_BYTES, graph_time_us, norm_inputs,  # noqa: E402
                                     over_custom_limit, rank_communicator, rank_env,
                                     run_ranks)

# BENCH_ROWS="1 16" narrows the rows of a run (a quick before/after); BENCH_SINGLE_GPU=0
# leaves out the single-GPU peers (torch eager / compile / Triton at hidden[0])
ROWS = [int(n) for n in os.environ.get("BENCH_ROWS", "1 16 64 256 384 1024 2048 4096").split()]
# BENCH_ROUNDS=N times ours and the peers N times per shape, one after the other in turn, and
# reports each time as the median over rounds of the slowest rank's (every round kept as
# `<key>_rounds`): at 1-256 rows single samples move 10-25% between runs, and a ratio from
# interleaved rounds is not moved by a drift of the machine between two systems' samples
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1"))
# ----------------------------------------------------------------------------- single GPU

def triton_add_rmsnorm():
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, r, w, out, rout, H: tl.constexpr, B: tl.constexpr, eps):
        row = tl.program_id(0)
        offs = tl.arange(0, B)
        m = offs < H
        s = tl.load(x + row * H + offs, mask=m, other=0.).to(tl.float32) + \
            tl.load(r + row * H + offs, mask=m, other=0.).to(tl.float32)
        tl.store(rout + row * H + offs, s.to(rout.dtype.element_ty), mask=m)
        inv = tl.rsqrt(tl.sum(s * s, axis=0) / H + eps)
        wv = tl.load(w + offs, mask=m, other=0.).to(tl.float32)
        tl.store(out + row * H + offs, (s * inv * wv).to(out.dtype.element_ty), mask=m)

    def run(x, r, w, out, rout, eps=1e-6):
        H = x.shape[1]
        kernel[(x.shape[0],)](x, r, w, out, rout, H, triton.next_power_of_2(H), eps,
                              num_warps=16)
    return run


def single_gpu(torch, build: str, hidden: int, dev) -> dict:
    from peerdsl.runtime.cuda.loader import CudaLoader
    loader = CudaLoader(os.path.join(build, "sm_90", "manifest.json"))
    fp8 = loader.manifest.fp8_format
    ours = loader.kernel("add_rmsnorm", T="bf16", H=hidden, FP8=fp8)
    quant = loader.kernel("per_token_quant_fp8", T="bf16", H=hidden, FP8=fp8)
    tri = triton_add_rmsnorm()

    def eager(x, r, w, out, rout):
        s = x.float() + r.float()
        rout.copy_(s.to(x.dtype))
        out.copy_((s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float())
                  .to(x.dtype))
    compiled = torch.compile(eager)
    table = {}
    for rows in ROWS:
        sets = [[torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16) for _ in range(2)]
                for _ in range(4)]  # four rotating input sets (L2 is not warm for free)
        w = torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5
        out, rout = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][0])
        q = torch.empty(rows, hidden, device=dev, dtype=torch.int8)
        scale = torch.empty(rows, 1, device=dev, dtype=torch.float32)
        k = [0]

        def nxt():
            k[0] = (k[0] + 1) % 4
            return sets[k[0]]

        def ours_call():
            x, r = nxt()
            ours.launch(rows, dict(x=x, residual=r, weight=w, out=out,
                                             residual_out=rout, q=0, scale=0, rows=rows,
                                             eps=1e-6, flags=0))
        row = {"torch_eager": graph_time_us(torch, lambda: eager(*nxt(), w, out, rout), dev),
               "triton": graph_time_us(torch, lambda: tri(*nxt(), w, out, rout), dev),
               "peerdsl": graph_time_us(torch, ours_call, dev),
               "peerdsl_quant": graph_time_us(torch, lambda: quant.launch(
                   rows, dict(x=nxt()[0], q=q, scale=scale, rows=rows)), dev),
               "torch_quant": graph_time_us(torch, lambda: _torch_quant(torch, nxt()[0], q,
                                                                        scale), dev)}
        try:
            row["torch_compile"] = graph_time_us(torch, lambda: compiled(*nxt(), w, out, rout),
                                                 dev)
        except Exception as e:  # noqa: BLE001 - a peer that does not run is reported, not fatal
            row["torch_compile_error"] = str(e)[:200]
        table[rows] = row
    return table


def triton_alone(torch, hiddens, dev) -> dict:
    """{H: {rows: us}} of the Triton add + RMSNorm with the GPU to itself (the issue's
    baseline adds this to vLLM's all-reduce), four rotating input sets."""
    tri = triton_add_rmsnorm()
    table = {}
    for hidden in hiddens:
        w = torch.rand(hidden, device=dev, dtype=torch.bfloat16) + 0.5
        table[str(hidden)] = {}
        for rows in ROWS:
            sets = [[torch.randn(rows, hidden, device=dev, dtype=torch.bfloat16)
                     for _ in range(2)] for _ in range(4)]
            out, rout = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][0])
            k = [0]

            def call():
                k[0] = (k[0] + 1) % 4
                tri(*sets[k[0]], w, out, rout)
            table[str(hidden)][str(rows)] = graph_time_us(torch, call, dev)
    return table


def _torch_quant(torch, x, q, scale):
    f = x.float()
    s = f.abs().amax(-1, keepdim=True) * (1.0 / 448.0)
    scale.copy_(s)
    q.copy_((f * torch.where(s == 0, 0, 1.0 / s)).clamp(-448, 448).to(torch.float8_e4m3fn)
            .view(torch.int8))


def copy_bandwidth(torch, dev) -> dict:
    """Bytes read + written per second of a 1 GiB device copy, three ways: a memcpy node in a
    graph (may run on a copy engine), an eager cudaMemcpy timed by events, and an
    elementwise kernel in a graph (SMs). The floor uses the fastest."""
    a = torch.ones(1 << 28, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    moved = 2 * a.numel() * 4
    ways = {"graph_memcpy": graph_time_us(torch, lambda: b.copy_(a), dev),
            "graph_kernel": graph_time_us(torch, lambda: torch.mul(a, 1.0, out=b), dev)}
    t = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        t.append(e0.elapsed_time(e1) * 1000)
    ways["eager_memcpy"] = statistics.median(t)
    return {k: moved / (us * 1e-6) for k, us in ways.items()}


# ----------------------------------------------------------------------------- ranks

def rank_main(rank, world, port, build, hiddens, vllm_lib=None) -> dict:
    torch, dist, dev, comm, sync = rank_communicator(rank, world, port, build)
    result = {"null_us": graph_time_us(torch, comm.null_collective, dev, sync), "rows": {}}
    peer = None
    if vllm_lib:  # vLLM's all-reduce and the Triton norm, timed beside ours (peer_vllm.py)
        from benchmarks.peer_vllm import VllmAllReduce, peer_timings
        peer = VllmAllReduce(vllm_lib, rank, world, dist, max(ROWS) * max(hiddens) * 2)
        tri = triton_add_rmsnorm()
    for hidden in hiddens:
        for rows in ROWS:
            if over_custom_limit(rows, hidden):
                # the torch.distributed fallback, not ours, and the harness's gloo group
                # cannot run it under a CUDA graph: skipped, said once by rank 0
                if rank == 0:
                    print(f"skipped {hidden}:{rows}: {rows * hidden * 2} bytes are over the "
                          f"custom all-reduce's {CUSTOM_MAX_BYTES}", file=sys.stderr)
                continue
            x, res, w = norm_inputs(torch, rows, hidden, dev)
            comm.fused_allreduce_rmsnorm(x, res, w)
            path = comm.last_path
            comm.all_reduce(x)
            ar_path = comm.last_path
            cap = comm.graph_capture

            def one_round() -> dict:
                got = {"ar_us": graph_time_us(torch, lambda: comm.all_reduce(x), dev, sync, cap),
                       "rms_us": graph_time_us(torch, lambda: comm.add_rmsnorm(x, res, w), dev,
                                               sync),
                       "fused_us": graph_time_us(torch, lambda: comm.fused_allreduce_rmsnorm(
                           x, res, w), dev, sync, cap),
                       # the unfused pair as a caller runs it: each norm between two
                       # all-reduces (ar_us + rms_us times each alone, back to back, so the
                       # ranks' skews do not add)
                       "pair_us": graph_time_us(torch, lambda: comm.add_rmsnorm(
                           comm.all_reduce(x), res, w), dev, sync, cap)}
                if peer is not None:
                    got.update(peer_timings(torch, graph_time_us, peer, comm, tri, x, res, w,
                                            dev, sync))
                return got
            r = {"path": path, "ar_path": ar_path, **rounds_of(one_round, ROUNDS)}
            if os.environ.get("BENCH_SWEEP", "1") == "1":  # every valid path: the thresholds
                r["paths_us"] = forced_paths(torch, comm, x, res, w, dev, sync)
            if rows == 16 and hidden == hiddens[0]:  # host cost of one eager call
                torch.cuda.synchronize(dev)
                t = []
                for _ in range(50):
                    t0 = time.perf_counter()
                    comm.fused_allreduce_rmsnorm(x, res, w)
                    t.append((time.perf_counter() - t0) * 1e6)
                    torch.cuda.synchronize(dev)
                    dist.barrier()
                result["host_us"] = statistics.median(t)
                # every rank makes the calls (they are collective); rank 0 keeps the text
                prof = _profile(lambda: comm.fused_allreduce_rmsnorm(x, res, w),
                                lambda: (torch.cuda.synchronize(dev), dist.barrier()))
                if rank == 0:
                    result["host_profile"] = prof
            result["rows"][f"{hidden}:{rows}"] = r
    torch.cuda.synchronize(dev)
    dist.barrier()
    return result


def rounds_of(one_round, rounds: int) -> dict:
    """one_round()'s values, with each time's samples over `rounds` rounds as `<key>_rounds`
    when there is more than one (bench_report.merge takes the median of the ranks' max)."""
    got = [one_round() for _ in range(rounds)]
    if rounds == 1:
        return got[0]
    out = dict(got[0])
    for key in got[0]:
        if key.endswith("_us"):
            out[f"{key}_rounds"] = [g[key] for g in got]
    return out


def _profile(call, settle) -> str:
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    for _ in range(50):
        prof.enable()
        call()
        prof.disable()
        settle()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    return text.getvalue()[-4000:]


def main() -> int:
    if "--ar-variants" in sys.argv[1:]:  # every one-/two-stage variant: bench_ar_variants.py
        from benchmarks.bench_ar_variants import main as ar_variants
        return ar_variants([a for a in sys.argv[1:] if a != "--ar-variants"])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, nargs="+", default=[6144])
    ap.add_argument("--json", default=None)
    ap.add_argument("--replot", metavar="JSON", help="redraw the table and plot of a saved run")
    ap.add_argument("--vllm-header", metavar="DIR",
                    help="also time vLLM's custom all-reduce (its header in DIR: "
                         "scripts/peer_sources.sh) and the vLLM + Triton pair, side by side")
    ap.add_argument("--vllm-lib", help=argparse.SUPPRESS)
    ap.add_argument("--rank-worker", nargs=3, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--host-cost", action="store_true",
                    help="only the host cost of one eager call, plain and prepared, back to "
                         "back and after an idle GPU (benchmarks/host_cost_gpu.py)")
    args = ap.parse_args()
    if args.host_cost:
        from benchmarks.host_cost_gpu import run
        return run(args.build, args.tp, args.hidden[0], [16, 2], args.json)
    if args.replot:
        with open(args.replot) as f:
            saved = json.load(f)
        print(report(saved))
        plot(saved, os.path.splitext(args.replot)[0] + ".png")
        return 0
    if args.rank_worker:
        rank, world, port = args.rank_worker
        print("REPORT " + json.dumps(rank_main(rank, world, port, args.build, args.hidden,
                                               args.vllm_lib)), flush=True)
        return 0
    import torch
    dev = torch.device("cuda:0")
    ways = copy_bandwidth(torch, dev)
    summary = {"bandwidth_Bps": max(ways.values()), "bandwidth_ways_Bps": ways,
               "hidden": args.hidden, "single_gpu": {}}
    if os.environ.get("BENCH_SINGLE_GPU", "1") == "1":
        summary["single_gpu"] = single_gpu(torch, args.build, args.hidden[0], dev)
    print(f"copy bandwidth {summary['bandwidth_Bps'] / 1e12:.2f} TB/s ("
          + ", ".join(f"{k} {v / 1e12:.2f}" for k, v in ways.items()) + ")", flush=True)
    peer_args = []
    if args.vllm_header:
        from benchmarks.peer_vllm import build_shim
        lib = build_shim(args.vllm_header, os.environ.get("OUT") or ".")
        peer_args = ["--vllm-lib", lib]
        summary["triton_alone_us"] = triton_alone(torch, args.hidden, dev)
    with rank_env(max(args.tp)) as env:
        for tp in args.tp:
            reps = run_ranks([sys.executable, __file__, "--build", args.build, "--hidden",
                              *map(str, args.hidden), *peer_args], tp, env, timeout_s=600)
            if reps is None:
                return 1
            summary[f"tp{tp}"] = merge(reps)
    path = args.json or (os.path.join(os.environ["OUT"], "bench.json")
                         if os.environ.get("OUT") else "bench.json")
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)
    print(report(summary))
    if args.vllm_header:
        from benchmarks.peer_vllm import peers_table
        print(peers_table(summary))
    for tp in [k for k in summary if k.startswith("tp")]:
        print(f"host profile {tp}:\n{summary[tp].get('host_profile', '')}")
    plot(summary, os.path.splitext(path)[0] + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
