"""Step 2 of the tutorial: run ar_bias_rmsnorm on the CPU simulator and check it exactly.

    python3 examples/ar_bias_rmsnorm/check_sim.py [--tp 2 4] [--hidden 2880 6144] [--seeds 2]

For each world size, hidden size and seed: W simulated ranks (one thread each) launch the
kernel together under an adversarial schedule (random interleavings and store delays) with
every rank starting late by a different amount; then, on every rank,
  - out and residual_out equal reference.exact (the contract emulated in torch) byte for byte,
  - residual_out equals the float64 reference and out is within 1 ulp of it,
  - both equal the unfused chain (comm.all_reduce, + bias in torch, comm.add_rmsnorm).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ar_bias_rmsnorm_host as host  # noqa: E402
import ar_bias_rmsnorm_ref as reference  # noqa: E402

import peerdsl.sim  # noqa: E402


def check(world: int, rows: int, hidden: int, dtype: torch.dtype = torch.bfloat16,
          seed: int = 0, skew=None, grid: int = 2, eps: float = 1e-6,
          target: str | None = None) -> list[str]:
    """Run one case on `world` simulated ranks (of `target`'s kernels: the simulator's
    default when None); return the failures (empty: all exact)."""
    xs, residuals, bias, weight = reference.make_inputs(world, rows, hidden, dtype, seed)

    def body(comm):
        r = comm.rank
        fused = host.ar_bias_rmsnorm(comm, xs[r], bias, residuals[r], weight, eps, grid)
        # the threads a row of the variant it ran, for the reference's sum order
        block = comm.launch_constexprs(host.OP, {"T": dtype, "H": hidden, "W": world})["B"]
        return fused, host.unfused(comm, xs[r], bias, residuals[r], weight, eps), block

    results = peerdsl.sim.run(world, body, seed=seed, skew=skew,
                              **({"target": target} if target else {}))
    failures = []
    for r, ((out, res_out), (u_out, u_res_out), block) in enumerate(results):
        want_out, want_res = reference.exact(xs, bias, residuals[r], weight, eps, block)
        f64_out, f64_res = reference.float64(xs, bias, residuals[r], weight, eps)
        tag = (f"TP{world} rows={rows} H={hidden} B={block} {dtype} seed={seed} skew={skew} "
               f"rank {r}")
        for what, ok in [("out == exact", reference.same_bytes(out, want_out)),
                         ("residual_out == exact", reference.same_bytes(res_out, want_res)),
                         ("residual_out == float64", reference.same_bytes(res_out, f64_res)),
                         ("out within 1 ulp of float64", reference.ulp_diff(out, f64_out) <= 1),
                         ("out == unfused", reference.same_bytes(out, u_out)),
                         ("residual_out == unfused", reference.same_bytes(res_out, u_res_out))]:
            if not ok:
                failures.append(f"{tag}: {what} fails")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--hidden", type=int, nargs="+", default=[2880, 6144])
    ap.add_argument("--rows", type=int, default=3, help="rows per call (the grid is 2 blocks)")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--target", default=None,
                    help="whose kernels to simulate (sm_90 runs 384 threads a row at 2880)")
    args = ap.parse_args()
    failures, cases = [], 0
    t0 = time.perf_counter()
    for tp in args.tp:
        for hidden in args.hidden:
            for seed in range(args.seeds):
                skew = [(r * 7919 * (seed + 1)) % 600 for r in range(tp)]  # ranks start late
                failures += check(tp, args.rows, hidden, torch.bfloat16, seed, skew,
                                  target=args.target)
                cases += 1
    print(f"{cases} cases (TP {args.tp} x H {args.hidden} x {args.seeds} seeds, skewed): "
          f"{len(failures)} failures, {time.perf_counter() - t0:.1f} s")
    for f in failures:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
