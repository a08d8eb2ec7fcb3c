"""The gather kernel (ops/fused_ar_rms_gather.py) beside add + RMSNorm, one process, one
rank's launch each: the same bytes (a row's 2H bytes read from staging or from x, the
residual read, two outputs written), so a gap between them is the gather's access pattern
or code, not its traffic. For Nsight Compute (both kernels wait for nothing):

    PYTHONPATH=. python3 benchmarks/ncu_gather_vs_norm.py --build build --hidden 2880 --world 4
    ncu --clock-control none -k regex:"gather|add_rmsnorm" --launch-skip 2 --launch-count 2 \\
        --section SpeedOfLight python3 benchmarks/ncu_gather_vs_norm.py ... --no-graph

Without --no-graph: us per launch of each (a graph of 20 launches, median of 30 replays) and
the bytes over that time. Checks first that the gather's outputs equal add + RMSNorm's of
the rows its staging holds (the staging holds x's shards, as stage 1 would leave them).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from peerdsl import layout  # noqa: E402

CALLS, REPLAYS = 20, 30


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--no-graph", action="store_true", help="plain launches (for ncu)")
    args = ap.parse_args(argv)

    import torch

    from benchmarks.rank_harness import replay_median_us
    from peerdsl.runtime.cuda.loader import CudaLoader
    W, H, rows, dev = args.world, args.hidden, args.rows, torch.device("cuda:0")
    loader = CudaLoader(os.path.join(args.build, "sm_90", "manifest.json"))
    base = {"T": "bf16", "H": H, "FP8": "e4m3fn"}
    gather = loader.kernel("fused_ar_rms_gather", W=W, **base)
    norm = loader.kernel("add_rmsnorm", **base)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(rows, H, generator=g).to(torch.bfloat16).to(dev)
    residual = torch.randn(rows, H, generator=g).to(torch.bfloat16).to(dev)
    weight = (torch.rand(H, generator=g) + 0.5).to(torch.bfloat16).to(dev)
    shard = H // W
    staging = [x[:, p * shard:(p + 1) * shard].contiguous() for p in range(W)]
    sig = torch.zeros(layout.SIGNAL_BYTES // 4, dtype=torch.int32, device=dev)
    outs = {k: (torch.empty_like(x), torch.empty_like(x)) for k in ("gather", "norm")}
    common = dict(residual=residual, weight=weight, q=0, scale=0, rows=rows, eps=1e-6, flags=0)
    launches = {
        "gather": (gather, dict(staging=[t.data_ptr() for t in staging],
                                sig=[sig.data_ptr()] * W, rank=0, out=outs["gather"][0],
                                residual_out=outs["gather"][1], **common)),
        "norm": (norm, dict(x=x, out=outs["norm"][0], residual_out=outs["norm"][1], **common)),
    }
    for _ in range(3 if args.no_graph else 1):
        for kernel, a in launches.values():
            kernel.launch(rows, a, trusted=True)
    torch.cuda.synchronize(dev)
    same = all(torch.equal(a.view(torch.int16), b.view(torch.int16))
               for a, b in zip(outs["gather"], outs["norm"]))
    print(f"H={H} W={W} rows={rows}: gather outputs {'equal' if same else 'DIFFER from'} "
          "add + RMSNorm's")
    if args.no_graph or not same:
        return 0 if same else 1
    moved = 4 * rows * H * 2  # a row in, the residual in, two outputs
    for name, (kernel, a) in launches.items():
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(dev)
        with torch.cuda.graph(graph, stream=side):
            for _ in range(CALLS):
                kernel.launch(rows, a, stream=side, trusted=True)
        us = replay_median_us(torch, graph, CALLS, REPLAYS)
        print(f"  {name}: {us:.1f} us per launch, {moved / us / 1e6:.2f} TB/s "
              f"({kernel.entry.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
