"""`peerdsl demo`: the main job end to end.

Builds every op for gfx1250 (code objects + manifest), then runs the fused all-reduce +
add + RMSNorm at TP4: on the GPU when one is present (ranks as processes, sm_90 build),
else on the CPU simulator emulating gfx1250. Prints the path dispatch took and the check
against the reference.
"""
from __future__ import annotations

import argparse
import time

HELP = "build every op for gfx1250 and run the fused all-reduce + RMSNorm at TP4"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--out", default="build", help="build directory (default: build)")
    p.add_argument("--tp", type=int, default=4, help="ranks (default 4)")
    p.add_argument("--rows", type=int, default=4, help="rows of the fused call (default 4)")
    p.add_argument("--hidden", type=int, default=6144, help="hidden size (default 6144)")
    p.add_argument("--no-build", action="store_true", help="skip the gfx1250 build")
    p.add_argument("--sim", action="store_true", help="use the simulator even with a GPU")


def _build(out: str) -> None:
    from .lowering.build import build
    t0 = time.time()
    manifest = build("gfx1250", None, out)
    kernels = manifest["kernels"]
    spills = sum(e["resources"].get("vgpr_spill", 0) + e["resources"].get("sgpr_spill", 0)
                 for e in kernels.values())
    print(f"built {len(kernels)} gfx1250 kernels into {out}/gfx1250 in {time.time() - t0:.1f} s "
          f"(spills: {spills})")


def _run_sim(tp: int, rows: int, hidden: int) -> bool:
    import torch

    from . import sim
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(rows, hidden, generator=g).to(torch.bfloat16) for _ in range(tp)]
    residual = torch.randn(rows, hidden, generator=g).to(torch.bfloat16)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(torch.bfloat16)

    def rank(comm):
        out, res_out = comm.fused_allreduce_rmsnorm(xs[comm.rank], residual, weight)
        return comm.last_path, out, res_out

    t0 = time.time()
    results = sim.run(tp, rank, seed=0, skew=lambda i: [97 * r * (i + 1) % 400 for r in range(tp)])
    took = time.time() - t0
    ar = xs[0].float()
    for x in xs[1:]:
        ar = ar + x.float()
    ar = ar.to(torch.bfloat16)
    s = ar.float() + residual.float()
    ref = (s.double() * torch.rsqrt((s.double() ** 2).mean(-1, keepdim=True) + 1e-6)
           * weight.double()).to(torch.bfloat16)
    path = results[0][0]
    identical = all(torch.equal(r[1], results[0][1]) and torch.equal(r[2], results[0][2])
                    for r in results)
    res_ok = torch.equal(results[0][2], s.to(torch.bfloat16))
    ulps = _ulps(results[0][1], ref)
    ok = identical and res_ok and ulps <= 1
    print(f"simulator (gfx1250, TP{tp}, {rows}x{hidden} bf16, skewed ranks): path {path}, "
          f"{took:.1f} s")
    print(f"  ranks bitwise identical: {identical}; residual_out exact: {res_ok}; "
          f"out vs float64 reference: at most {ulps} bf16 ulp apart (contract: <= 1)")
    return ok


def _ulps(a, b) -> int:
    """Largest distance in bf16 units of the last place (sign-magnitude mapped to a line)."""
    import torch
    ia = a.view(torch.int16).to(torch.int32)
    ib = b.view(torch.int16).to(torch.int32)
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return int((ia - ib).abs().max())


def run(args: argparse.Namespace) -> int:
    if not args.no_build:
        _build(args.out)
    import torch
    if torch.cuda.is_available() and not args.sim:
        import subprocess
        import sys
        import os
        if not args.no_build:
            from .lowering.build import build
            build("sm_90", None, args.out)
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                              "gpu_collectives.py")
        print("GPU present: running the multi-rank GPU check (scripts/gpu_collectives.py)")
        return subprocess.call([sys.executable, script, "--build",
                                args.out, "--tp", str(args.tp), "--steps", "20",
                                "--replays", "100"])
    ok = _run_sim(args.tp, args.rows, args.hidden)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
