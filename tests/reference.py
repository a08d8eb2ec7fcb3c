"""Host references for SPEC section 2, in torch: an exact-contract one (fp32, rank order) and
a float64 one for the tolerance checks."""
from __future__ import annotations

import torch

FP8_MAX = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}
FP8_DTYPE = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}


def all_reduce_ref(xs: list[torch.Tensor]) -> torch.Tensor:
    """T(((x_0 + x_1) + x_2) + ...), each term f32, in rank order."""
    acc = xs[0].float()
    for x in xs[1:]:
        acc = acc + x.float()
    return acc.to(xs[0].dtype)


def add_rmsnorm_f64(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                    eps: float = 1e-6, gemma_norm: bool = False):
    """(out, residual_out) from float64 math on the T inputs (rounded to T at the end)."""
    s32 = x.float() + residual.float()  # exact in f32 for bf16/f16 sums? rounding named by SPEC
    s = s32.double()
    inv = torch.rsqrt((s * s).mean(dim=-1, keepdim=True) + eps)
    w = weight.double() + (1.0 if gemma_norm else 0.0)
    return (s * inv * w).to(x.dtype), s32.to(x.dtype)


def quant_fp8_ref(out_t: torch.Tensor, fmt: str):
    """Per-token FP8 of a T tensor, per SPEC 2.4 (torch's RNE conversion with our clamp)."""
    f = out_t.float()
    amax = f.abs().amax(dim=-1, keepdim=True)
    scale = amax * torch.tensor(1.0 / FP8_MAX[fmt], dtype=torch.float32)
    inv = torch.where(scale == 0, torch.zeros_like(scale), 1.0 / scale)
    q = (f * inv).clamp(-FP8_MAX[fmt], FP8_MAX[fmt]).to(FP8_DTYPE[fmt])
    q = torch.where(f == 0, torch.zeros_like(q.view(torch.uint8)), q.view(torch.uint8))
    return q.view(FP8_DTYPE[fmt]), scale  # zero outputs are +0 bytes (see ops/_rows.py)


def ulp_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units of the last place between two bf16/f16 tensors."""
    ia = a.contiguous().view(torch.int16).to(torch.int32)
    ib = b.contiguous().view(torch.int16).to(torch.int32)
    # map sign-magnitude to a monotonic integer line
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return int((ia - ib).abs().max()) if a.numel() else 0


def norm_case(rows: int, hidden: int, seed: int, dtype=torch.bfloat16):
    """(x, residual, weight) of a norm-kernel test, drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    residual = torch.randn(rows, hidden, generator=g).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    return x, residual, weight


def norm_outputs(rows: int, hidden: int, dtype=torch.bfloat16) -> dict:
    """Zeroed out, residual_out, q and scale buffers of a norm kernel's direct launch."""
    return dict(out=torch.zeros(rows, hidden, dtype=dtype),
                residual_out=torch.zeros(rows, hidden, dtype=dtype),
                q=torch.zeros(rows, hidden, dtype=torch.int8),
                scale=torch.zeros(rows, dtype=torch.float32))
