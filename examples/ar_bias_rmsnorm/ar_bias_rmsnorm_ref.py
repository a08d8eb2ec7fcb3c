"""Host references for ar_bias_rmsnorm, in torch (CPU or CUDA tensors).

`exact`: the kernel's contract (ar_bias_rmsnorm.py's docstring) emulated op by op in f32,
sum of squares in dsl.block_sum's order, so its bytes are the kernel's bytes.
`float64`: the same formula in float64 from the T inputs; it differs from the kernel only by
the roundings the contract names, so `out` lands within 1 ulp of T and residual_out is equal.
"""
from __future__ import annotations

import torch

BLOCK, PACK, GROUP = 256, 8, 32


def make_inputs(world: int, rows: int, hidden: int, dtype: torch.dtype, seed: int):
    """Every rank's x and residual (each rank its own), and the bias and weight all share.
    Made on the CPU, so every process and device gets the same values."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(rows, hidden, generator=g).to(dtype) for _ in range(world)]
    residuals = [torch.randn(rows, hidden, generator=g).to(dtype) for _ in range(world)]
    bias = (0.1 * torch.randn(hidden, generator=g)).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    return xs, residuals, bias, weight


def biased_sum(xs: list[torch.Tensor], bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """s = f32(T(f32(T(rank-order sum)) + f32(bias))) + f32(residual), in f32."""
    acc = xs[0].float()
    for x in xs[1:]:
        acc = acc + x.float()
    a = acc.to(xs[0].dtype)
    b = (a.float() + bias.float()).to(xs[0].dtype)
    return b.float() + residual.float()


def block_sum_of_squares(s: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """sum_j s_j^2 per row, added in dsl.block_sum's order for a `block`-thread block where
    thread t owns the packs t, t + block, ...: each thread serially over its packs and their
    8 elements, a butterfly (xor 16, 8, 4, 2, 1) inside each 32-lane group, then the group
    partials serially in group order."""
    BLOCK = block  # noqa: N806 (the module's default, overridden)
    rows, H = s.shape
    per_thread = (H // PACK + BLOCK - 1) // BLOCK
    padded = torch.zeros(rows, per_thread * BLOCK * PACK, dtype=torch.float32, device=s.device)
    padded[:, :H] = s
    sq = (padded * padded).view(rows, per_thread, BLOCK, PACK).permute(0, 2, 1, 3)
    sq = sq.reshape(rows, BLOCK, per_thread * PACK)
    acc = torch.zeros(rows, BLOCK, dtype=torch.float32, device=s.device)
    for e in range(sq.shape[-1]):
        acc = acc + sq[:, :, e]
    lanes = torch.arange(BLOCK, device=s.device)
    for mask in (16, 8, 4, 2, 1):
        acc = acc + acc[:, lanes ^ mask]
    total = acc[:, 0]
    for g in range(1, BLOCK // GROUP):
        total = total + acc[:, g * GROUP]
    return total


def exact(xs: list[torch.Tensor], bias: torch.Tensor, residual: torch.Tensor,
          weight: torch.Tensor, eps: float = 1e-6,
          block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) with the bytes of the kernel built with `block` threads a row
    (its constexpr B: `comm.launch_constexprs(...)["B"]`)."""
    T, H = xs[0].dtype, xs[0].shape[-1]
    s = biased_sum(xs, bias, residual)
    mean = block_sum_of_squares(s, block) / torch.tensor(float(H), dtype=torch.float32)
    # 1 / sqrt in f32, each correctly rounded as the DSL's rsqrt is. torch's f32 sqrt on the
    # CPU is not (it is off by an ulp for some inputs): sqrt in float64 rounded once to f32
    # is the correctly rounded f32 sqrt (53 >= 2 * 24 + 2 bits); f32 division is exact IEEE.
    root = (mean + torch.tensor(eps, dtype=torch.float32)).double().sqrt().float()
    inv = 1.0 / root
    out = (s * inv[:, None]) * weight.float()
    return out.to(T), s.to(T)


def float64(xs: list[torch.Tensor], bias: torch.Tensor, residual: torch.Tensor,
            weight: torch.Tensor, eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual_out) from float64 math after the contract's T roundings of a and b."""
    T = xs[0].dtype
    s = biased_sum(xs, bias, residual).double()
    inv = torch.rsqrt((s * s).mean(dim=-1, keepdim=True) + eps)
    return (s * inv * weight.double()).to(T), s.to(T)


def ulp_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units of the last place between two bf16/f16 tensors."""
    ia = a.contiguous().view(torch.int16).to(torch.int32)
    ib = b.contiguous().view(torch.int16).to(torch.int32)
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)  # sign-magnitude onto a monotonic line
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return int((ia - ib).abs().max()) if a.numel() else 0


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16),
                                              b.contiguous().view(torch.int16))
