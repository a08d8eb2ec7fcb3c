"""One rank's one-/two-stage all-reduce kernel (or the fused one-stage kernel: `--path
fused1`) with its peers' barrier arrivals written in advance: a launch Nsight Compute can
profile, and a timing without barrier waits. `--path gather` runs the split fused two-stage
path's second launch (ops/fused_ar_rms_gather.py), which waits for no peer: the peers'
staging holds their reduced column shards (`gather_staging`), its grid one block per row.
`--path stage1` runs that path's first launch (fused_ar_rms_2stage with S = 1: the column
shards reduced into each rank's own staging, between its two barriers). `--path norm` runs
add_rmsnorm on the all-reduced rows: the same bytes as the gather, read from one buffer
instead of W shards; `--path triton` the Triton add + RMSNorm of
bench_ar_rms.py (the pair's norm) on them. `--cx B=384 M=4` picks a built variant by more
constexprs (scripts/norm_block_probe_build.py builds several thread mappings).

    PYTHONPATH=. python3 benchmarks/ncu_ar_one_rank.py --build build --path 2stage --world 4 \
        --rows 1024 --unroll 4 --block 256                     # time it (CUDA graph)
    ncu --clock-control none -k regex:allreduce_ --launch-skip 2 --launch-count 1 \
        --set full -o $OUT/ar2 python3 benchmarks/ncu_ar_one_rank.py ... --no-graph

Why: ncu serializes kernels, so W rank kernels that wait for each other would each spin to
their timeout. Here one process holds every rank's input, staging and Signal, and before
each launch the launched rank's Signal holds, in each slot its barriers wait on, what the
peers would have sent: {epoch 2, the call's tag}. Its first barrier (target 1) then sees a
peer one barrier ahead (accepted: that peer vouched for this call), the second (target 2)
its target with the tag. Kernels with two barriers only: allreduce_1stage, allreduce_2stage
with E=0, fused_ar_rms_2stage with S=1, and fused_ar_rms_1stage (V rows per block as the
communicator picks them). The block epochs are zeroed before each launch (so the same
slots serve every launch and every ncu replay pass, which restores memory in between). The
peers' staging holds their reduced shards, so `out` is the whole all-reduce: checked bitwise
against the rank-order reference (the fused kernel's residual_out: that sum plus the
residual; stage 1's own staging: its column shard of that sum), and the Signal's error
record must stay clear.

`--all-ranks` launches every rank's kernel at once on its own stream (each with its own
pre-filled Signal): the HBM traffic of W ranks, without their barrier waits or skew. The
real MPS figure minus this one is what synchronization costs.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from peerdsl import layout  # noqa: E402

TAG = 12345
CALLS, REPLAYS = 20, 30


def prefill(sig, rank: int, world: int, grid: int, torch) -> None:
    """The slots of `rank`'s Signal (an i32 tensor) that its two barriers wait on."""
    slots = sig.view(torch.int64)
    base = layout.SIG_SLOTS // layout.SLOT_WORDS
    word = (TAG << 32) | 2
    for b in range(grid):
        for p in range(world):
            if p != rank:
                slots[base + b * layout.MAX_RANKS + p] = word


def gather_staging(all_reduced, world: int) -> list:
    """Every rank's staging as the split fused kernel's stage 1 leaves it: rank p's holds
    column shard p of every row of the all-reduced rows, row after row."""
    rows, hidden = all_reduced.shape
    shards = all_reduced.view(rows, world, hidden // world)
    return [shards[:, p].contiguous() for p in range(world)]


class TritonNorm:
    """The Triton add + RMSNorm behind a launch(grid, args, stream) like a loaded kernel's."""

    def __init__(self, run):
        self.run = run

    def launch(self, grid: int, a: dict, stream) -> None:
        import torch
        with torch.cuda.stream(stream):
            self.run(a["x"], a["residual"], a["weight"], a["out"], a["residual_out"], a["eps"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--path", choices=["1stage", "2stage", "fused1", "stage1", "gather", "norm",
                                       "triton"],
                    default="2stage")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--rows", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=6144)
    ap.add_argument("--unroll", type=int, default=1)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--grid", type=int, default=0,
                    help="blocks (0: what the communicator launches with W ranks on one GPU)")
    ap.add_argument("--no-graph", action="store_true", help="plain launches (for ncu)")
    ap.add_argument("--launches", type=int, default=3, help="plain launches with --no-graph")
    ap.add_argument("--all-ranks", action="store_true", help="every rank at once, one stream each")
    ap.add_argument("--cx", nargs="*", default=[], metavar="KEY=INT",
                    help="more constexprs naming the variant (e.g. B=384 M=4)")
    args = ap.parse_args(argv)
    extra = {k: int(v) for k, v in (c.split("=", 1) for c in args.cx)}

    import torch

    from peerdsl.runtime.cuda.loader import CudaLoader
    W, dev = args.world, torch.device("cuda:0")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    fused = args.path in ("fused1", "stage1", "gather", "norm", "triton")
    local = args.path in ("gather", "norm", "triton")  # no barrier: one block per row
    if local:
        V, name = 1, {"gather": "fused_ar_rms_gather", "norm": "add_rmsnorm",
                      "triton": "add_rmsnorm"}[args.path]
        cx = {"T": "bf16", "H": args.hidden, **({"W": W} if args.path == "gather" else {})}
    elif args.path == "stage1":  # the build's one split schedule for T, H and W
        V, name = 1, "fused_ar_rms_2stage"
        cx = {"T": "bf16", "H": args.hidden, "W": W, "S": 1}
    elif fused:
        from peerdsl.runtime.kernel_variants import fused_1stage_rows
        V = fused_1stage_rows("sm_90", W, args.rows, args.hidden, sms // W)
        cx = {"T": "bf16", "H": args.hidden, "W": W, **({"V": V} if V > 1 else {})}
        name = "fused_ar_rms_1stage_rows" if V > 1 else "fused_ar_rms_1stage"
    else:
        V, name = 1, f"allreduce_{args.path}"
        cx = {"T": "bf16", "W": W, "U": args.unroll, "B": args.block}
        if args.path == "2stage":
            cx["E"] = 0
    cx.update(extra)
    if args.path == "triton":  # the same arguments, through Triton's launch
        from benchmarks.bench_ar_rms import triton_add_rmsnorm
        kernel = TritonNorm(triton_add_rmsnorm())
    else:
        kernel = CudaLoader(os.path.join(args.build, "sm_90", "manifest.json")).kernel(name,
                                                                                    **cx)
    g = torch.Generator().manual_seed(7)
    xs = [(torch.randn(args.rows, args.hidden, generator=g) * (r + 1)).to(torch.bfloat16)
          for r in range(W)]
    ref = xs[0].float()
    for x in xs[1:]:
        ref = ref + x.float()
    ref = all_reduced = ref.to(torch.bfloat16).to(dev)
    if fused:  # what the kernel's residual_out holds: T(f32(ar) + f32(residual))
        residual = torch.randn(args.rows, args.hidden, generator=g).to(torch.bfloat16).to(dev)
        weight = (torch.rand(args.hidden, generator=g) + 0.5).to(torch.bfloat16).to(dev)
        ref = (ref.float() + residual.float()).to(torch.bfloat16)
    inputs = [x.to(dev) for x in xs]
    table = torch.tensor(layout.peer_row([x.data_ptr() for x in inputs]), dtype=torch.int64,
                         device=dev)
    packs = args.rows * args.hidden // 8
    work = packs // W if args.path == "2stage" else packs
    per_block = V if fused else args.block * args.unroll
    grid = args.grid or max(1, min(-(-(args.rows if fused else work) // per_block), sms // W,
                                   layout.MAX_BLOCKS))
    if local:  # one block per row, as the communicator launches them
        grid = args.grid or min(args.rows, 65535)
    # staging of every rank: what its stage 1 writes (two-stage: its reduced shard,
    # contiguous packs; gather: see gather_staging)
    staging = []
    if args.path == "2stage":
        staging = [t.clone() for t in ref.view(-1).view(W, -1)]
    elif args.path == "gather":
        staging = gather_staging(all_reduced, W)
    elif args.path == "stage1":  # what it writes: each rank's own column shard, zeroed here
        shards = gather_staging(all_reduced, W)
        staging = [torch.zeros_like(t) for t in shards]
    scratch = [torch.zeros(layout.SIGNAL_BYTES // 4, dtype=torch.int32, device=dev)
               for _ in range(W)]  # what the fake peers' Signals receive
    ranks = list(range(W)) if args.all_ranks else [args.rank]
    own, outs, launch_args = {}, {}, {}
    for r in ranks:
        s = own[r] = torch.zeros(layout.SIGNAL_BYTES // 4, dtype=torch.int32, device=dev)
        s[layout.SIG_SPIN_LIMIT] = 1 << 20
        if not local:  # (a local kernel waits on no slot; its grid may pass MAX_BLOCKS)
            prefill(s, r, W, grid, torch)
        outs[r] = torch.empty_like(ref)
        sig = [s.data_ptr() if p == r else scratch[p].data_ptr() for p in range(W)]
        a = {"inp": table.data_ptr(), "out": outs[r], "sig": sig, "rank": r, "call": TAG}
        if fused:  # outs[r] is residual_out; out is the normed row (not checked)
            a.update(out=torch.empty_like(ref), residual_out=outs[r], residual=residual,
                     weight=weight, q=0, scale=0, rows=args.rows, eps=1e-6, flags=0)
        if args.path == "stage1":  # its own staging is what it writes, checked below
            outs[r] = staging[r]
            a.update(out=torch.empty_like(ref), residual_out=torch.empty_like(ref),
                     staging=[t.data_ptr() for t in staging])
        elif args.path == "gather":  # reads the staging, not the inputs
            del a["inp"], a["call"]
            a["staging"] = [t.data_ptr() for t in staging]
        elif args.path in ("norm", "triton"):  # reads the all-reduced rows; no Signal
            for k in ("inp", "call", "sig", "rank"):
                del a[k]
            a["x"] = all_reduced
        elif args.path == "2stage":
            a.update(staging=[t.data_ptr() for t in staging], shard_packs=work)
        elif args.path == "1stage":
            a["n_packs"] = packs
        launch_args[r] = a
    streams = {r: torch.cuda.Stream(dev) for r in ranks}

    def once(with_kernel: bool = True) -> None:
        cur = torch.cuda.current_stream(dev)
        for r in ranks:
            streams[r].wait_stream(cur)
            with torch.cuda.stream(streams[r]):
                own[r][layout.SIG_EPOCH:layout.SIG_EPOCH + layout.MAX_BLOCKS].zero_()
                if with_kernel:
                    kernel.launch(grid, launch_args[r], stream=streams[r])
        for r in ranks:
            cur.wait_stream(streams[r])

    def timed(with_kernel: bool) -> float:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(dev)
        with torch.cuda.graph(graph, stream=side):
            for _ in range(CALLS):
                once(with_kernel)
        from benchmarks.rank_harness import replay_median_us
        return replay_median_us(torch, graph, CALLS, REPLAYS)

    for _ in range(args.launches if args.no_graph else 1):
        once()
    torch.cuda.synchronize(dev)
    for r in ranks:
        err = own[r][layout.SIG_ERROR:layout.SIG_ERROR + layout.ERROR_WORDS].tolist()
        if err[0]:
            print(f"rank {r}: a wait failed (error record {err}): the prefill is wrong")
            return 1
        want = shards[r] if args.path == "stage1" else ref
        if not torch.equal(outs[r].view(torch.int16), want.view(torch.int16)):
            print(f"rank {r}: out differs from the rank-order reference")
            return 1
    what = (f"{args.path} {' '.join(f'{k}={v}' for k, v in cx.items())} rows={args.rows} "
            f"H={args.hidden} grid={grid} ranks={ranks}")
    if args.no_graph:
        print(f"{what}: exact, {args.launches} launches")
        return 0
    total, memset = timed(True), timed(False)
    # one-stage: W packs read per pack written; two-stage: stage 1 reads W and writes 1 per
    # shard pack, stage 2 reads W and writes W; stage1: that first stage alone, per rank a
    # 1 / W share of the packs; gather: staging and residual read, out and residual_out
    # written
    moved = {"1stage": (W + 1) * packs, "2stage": (3 * W + 1) * work,
             "fused1": (W + 3) * packs, "stage1": (W + 1) * packs // W, "gather": 4 * packs,
             "norm": 4 * packs, "triton": 4 * packs}[args.path] * 16
    print(f"{what}: exact; {total:.1f} us per call with the epoch reset, {memset:.1f} us "
          f"the reset alone, so ~{total - memset:.1f} us the kernel(s); "
          f"{moved * len(ranks) / max(1e-9, total - memset) / 1e6:.2f} TB/s of its reads + "
          "writes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
