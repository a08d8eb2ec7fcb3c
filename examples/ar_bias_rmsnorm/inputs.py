"""The inputs recipe for `peerdsl compare ar_bias_rmsnorm --run`: the same arguments for the DSL
kernel and for the HIP kernel, and the bytes both must write.

    peerdsl compare ar_bias_rmsnorm --ref examples/ar_bias_rmsnorm/ar_bias_rmsnorm.hip \\
        --arch sm_90 --constexpr T=bf16 --constexpr H=6144 --constexpr W=4 --run \\
        --inputs examples/ar_bias_rmsnorm/inputs.py:inputs --build build

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ar_bias_rmsnorm_ref as reference  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16}


# PUBLIC-API: the recipe format of `peerdsl compare --run --inputs module:function` is defined
# by the compare work (issue 13 item 4); these keys are this example's proposal.
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
