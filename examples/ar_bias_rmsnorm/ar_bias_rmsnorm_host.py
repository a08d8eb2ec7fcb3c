"""The host side of ar_bias_rmsnorm: one call, the same on the simulator and on the GPU.

    from ar_bias_rmsnorm_host import ar_bias_rmsnorm
    out, residual_out = ar_bias_rmsnorm(comm, x, bias, residual, weight)   # every rank

`comm` is a `peerdsl.Communicator` (one process per rank) or the simulator's communicator
(`peerdsl.sim.run(tp, fn)` passes it to fn). Every rank calls together (it is a collective).
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ar_bias_rmsnorm as kernel_module  # noqa: E402  (importing registers the op)

OP = "ar_bias_rmsnorm"
MAX_BLOCKS = 256  # the Signal keeps one epoch counter per block index, for 256 blocks


def ar_bias_rmsnorm(comm, x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
                    weight: torch.Tensor, eps: float = 1e-6,
                    grid: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) = (RMSNorm(T(T(all_reduce(x)) + bias) + residual) * weight,
    T(T(T(all_reduce(x)) + bias) + residual)); see ar_bias_rmsnorm.py for the roundings.

    One block per row up to `grid` blocks (default: as many as the communicator keeps
    resident on every rank at once, since the blocks of all ranks wait on each other; at most
    MAX_BLOCKS)."""
    rows, hidden = x.shape
    grid = max(1, min(rows, MAX_BLOCKS, grid or getattr(comm, "max_grid", rows)))
    out, residual_out = torch.empty_like(x), torch.empty_like(x)
    comm.launch(OP, grid=grid, constexprs={"T": x.dtype, "H": hidden, "W": comm.world},
                inp=x, bias=bias, residual=residual, weight=weight, out=out,
                residual_out=residual_out, sig=comm.signal, rank=comm.rank, rows=rows,
                eps=eps)
    return out, residual_out


def unfused(comm, x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor,
            weight: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """What the fused op replaces: the shipped all-reduce, + bias in torch, the shipped
    add + RMSNorm kernel. Its bytes are the fused op's bytes."""
    out, residual_out = comm.add_rmsnorm(comm.all_reduce(x) + bias, residual, weight, eps=eps)
    return out, residual_out
