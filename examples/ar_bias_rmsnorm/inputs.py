"""The inputs recipe for `peerdsl compare ar_bias_rmsnorm --run`: the same arguments for the DSL
kernel and for the HIP kernel, and the bytes both must write.

    peerdsl compare ar_bias_rmsnorm --ref examples/ar_bias_rmsnorm/ar_bias_rmsnorm.hip \\
        --arch sm_90 --constexpr T=bf16 --constexpr H=6144 --constexpr W=4 --run \\
        --inputs examples/ar_bias_rmsnorm/inputs.py:compare_case --build build

The recipe returns, per rank, the kernel's arguments by parameter name. A peer parameter
(`inp`, a RegisteredPtrs) is the list of every rank's tensor: the DSL side gets a device
table of their addresses, the HIP side a `Peers<>` struct of them by value. `sig` and `rank`
are left to the tool, which gives each side its own Signal. The tool allocates fresh outputs
for the HIP side, launches both and compares every output with the other side and with
`expected` byte for byte.
"""
from __future__ import annotations

import os
import sys

import torch

from peerdsl.compare_run import Check, Output, RunCase, RunContext, recipe

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ar_bias_rmsnorm_ref as reference  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


def inputs(world: int, constexprs: dict, rows: int | None = None, device: str = "cuda",
           seed: int = 1234, eps: float = 1e-6) -> dict:
    """{"args": per-rank kernel arguments by name, "outputs": the names to compare,
    "work": rows (the largest useful grid: one block per row), "expected": per-rank exact
    outputs by name}, for `world` ranks and the variant `constexprs` (T, H)."""
    H, T = int(constexprs["H"]), DTYPES[str(constexprs.get("T", "bf16"))]
    rows = rows or 1024
    xs, residuals, bias, weight = reference.make_inputs(world, rows, H, T, seed)
    expected = [dict(zip(("out", "residual_out"),
                         reference.exact(xs, bias, residuals[r], weight, eps)))
                for r in range(world)]
    xs_d = [x.to(device) for x in xs]
    args = [{"inp": xs_d, "bias": bias.to(device), "residual": residuals[r].to(device),
             "weight": weight.to(device),
             "out": torch.empty(rows, H, dtype=T, device=device),
             "residual_out": torch.empty(rows, H, dtype=T, device=device),
             "rows": rows, "eps": eps} for r in range(world)]
    return {"args": args, "outputs": ["out", "residual_out"], "work": rows,
            "expected": [{k: v.to(device) for k, v in e.items()} for e in expected]}


@recipe(constexprs={"T": "bf16", "H": 6144, "W": 4})
def compare_case(ctx: RunContext) -> RunCase:
    """`peerdsl compare ar_bias_rmsnorm --run --inputs examples/ar_bias_rmsnorm/inputs.py:compare_case`:
    the DSL op and the HIP twin on the same inputs (--recipe-arg rows=N, default 1024)."""
    rows = ctx.option("rows", 1024)
    got = inputs(ctx.world, ctx.constexprs, rows=rows, device=ctx.device, seed=ctx.seed)
    W, t = ctx.world, ctx.torch
    sig_d, sig_r = ctx.signals(), ctx.signals()
    xs = got["args"][0]["inp"]
    table = ctx.device_table(xs)  # the DSL reads its peers' inputs through a device table
    outs_r = [{k: t.empty_like(got["args"][r][k]) for k in got["outputs"]} for r in range(W)]
    dsl_args, ref_args = [], []
    for r, a in enumerate(got["args"]):
        dsl_args.append({**a, "inp": table, "sig": sig_d, "rank": r})
        ref_args.append([xs, a["bias"], a["residual"], a["weight"], outs_r[r]["out"],
                         outs_r[r]["residual_out"], sig_r, r, rows, a["eps"]])
    outputs = [Output(k, [a[k] for a in got["args"]], [o[k] for o in outs_r])
               for k in got["outputs"]]
    checks = [Check(f"{k} rank {r} == the exact torch reference", got["args"][r][k],
                    got["expected"][r][k]) for r in range(W) for k in got["outputs"]]
    return RunCase(dsl_args, ref_args, outputs, grid=max(1, min(ctx.max_grid, rows, 256)),
                   checks=checks, signals={"DSL": sig_d, "reference": sig_r},
                   description=f"rows={rows}, H={ctx.constexprs['H']} {ctx.constexprs.get('T')}")
