"""Input recipes of the shipped ops for `peerdsl compare OP --run` (see compare_run.py).

Each is an ordinary recipe, the same kind a user passes with `--inputs MODULE:FUNCTION`:
given a RunContext it makes the inputs, each side's arguments and the outputs to compare.
A function here named like an op is that op's default recipe, and its `constexprs` are the
op's default variant for `peerdsl compare` (static table too).

    --recipe-arg rows=N    rows of H (fused: default 1024; LL: default 256 = 3 MiB at 6144)
    --recipe-arg hidden=H  LL only: row length (LL has no H constexpr; default 6144)
"""
from __future__ import annotations

from . import layout
from .compare_run import Check, CompareError, Output, RunCase, RunContext, recipe

BLOCK = 256


def _rank_order_sum(ctx: RunContext, xs: list) -> object:
    """The exact all-reduce the contract allows: f32 sum in rank order, rounded once."""
    acc = xs[0].float()
    for t in xs[1:]:
        acc = acc + t.float()
    return acc.to(ctx.torch.bfloat16)


def _need_bf16(ctx: RunContext, op: str) -> None:
    if ctx.constexprs.get("T") != "bf16":
        raise CompareError(f"the {op} reference is bf16 only; got T={ctx.constexprs.get('T')} "
                           "(pass --constexpr T=bf16)")


@recipe(constexprs={"T": "bf16", "H": 6144, "W": 4})
def fused_ar_rms_1stage(ctx: RunContext) -> RunCase:
    """All-reduce + residual add + RMSNorm against reference/hip/fused_ar_rms_1stage.hip."""
    _need_bf16(ctx, "fused_ar_rms_1stage")
    t, W, H = ctx.torch, ctx.world, int(ctx.constexprs["H"])
    rows = ctx.option("rows", 1024)
    x = [ctx.randn(rows, H) for _ in range(W)]
    res = [ctx.randn(rows, H) for _ in range(W)]
    w = ctx.randn(H)
    eps = 1e-6
    out_d, rout_d, out_r, rout_r = ([t.empty_like(x[0]) for _ in range(W)] for _ in range(4))
    q = t.empty(rows, H, dtype=t.int8, device=ctx.device)
    scale = t.empty(rows, dtype=t.float32, device=ctx.device)
    sig_d, sig_r = ctx.signals(), ctx.signals()
    inp_table = ctx.device_table(x)  # the DSL reads its peers' inputs through a device table
    dsl_args = [{"inp": inp_table, "residual": res[r], "weight": w, "out": out_d[r],
                 "residual_out": rout_d[r], "q": q, "scale": scale, "sig": sig_d, "rank": r,
                 "rows": rows, "eps": eps, "flags": 0} for r in range(W)]
    ref_args = [[x, res[r], w, out_r[r], rout_r[r], sig_r, r, rows, eps] for r in range(W)]
    ar = _rank_order_sum(ctx, x)
    checks = [Check(f"residual_out rank {r} == torch (rank-order sum + residual)", rout_d[r],
                    (ar.float() + res[r].float()).to(t.bfloat16)) for r in range(W)]
    grid = max(1, min(ctx.max_grid, rows, layout.MAX_BLOCKS))
    return RunCase(dsl_args, ref_args, [Output("out", out_d, out_r),
                                        Output("residual_out", rout_d, rout_r)],
                   grid=grid, checks=checks, signals={"DSL": sig_d, "reference": sig_r},
                   description=f"rows={rows}, H={H} bf16")


@recipe(constexprs={"T": "bf16", "W": 4})
def allreduce_ll(ctx: RunContext) -> RunCase:
    """LL all-reduce against reference/hip/allreduce_ll.hip."""
    _need_bf16(ctx, "allreduce_ll")
    t, W = ctx.torch, ctx.world
    rows, H = ctx.option("rows", 256), ctx.option("hidden", 6144)
    if (rows * H) % 8:
        raise CompareError(f"allreduce_ll moves 16-byte packs: rows*hidden={rows * H} is not a "
                           "multiple of 8 bf16")
    if rows * H * 2 > layout.LL_MAX_BYTES:
        raise CompareError(f"{rows}x{H} bf16 is {rows * H * 2} bytes, past the LL cap "
                           f"{layout.LL_MAX_BYTES} (use fewer --recipe-arg rows)")
    x = [ctx.randn(rows, H) for _ in range(W)]
    n_packs = rows * H // 8
    lines_per_peer = 2 * n_packs
    ll_d = [t.zeros(2 * W * lines_per_peer * 4, dtype=t.int32, device=ctx.device)
            for _ in range(W)]
    ll_r = [t.zeros_like(ll_d[0]) for _ in range(W)]
    out_d, out_r = ([t.empty_like(x[0]) for _ in range(W)] for _ in range(2))
    sig_d, sig_r = ctx.signals(), ctx.signals()
    dsl_args = [{"x": x[r], "out": out_d[r], "sig": sig_d, "ll": ll_d, "rank": r,
                 "n_packs": n_packs, "lines_per_peer": lines_per_peer} for r in range(W)]
    ref_args = [[x[r], out_r[r], sig_r, ll_r, r, n_packs, lines_per_peer] for r in range(W)]
    ar = _rank_order_sum(ctx, x)
    checks = [Check(f"out rank {r} == torch rank-order sum", out_d[r], ar) for r in range(W)]
    grid = max(1, min(ctx.max_grid, -(-n_packs // BLOCK), layout.MAX_BLOCKS))
    return RunCase(dsl_args, ref_args, [Output("out", out_d, out_r)], grid=grid, checks=checks,
                   signals={"DSL": sig_d, "reference": sig_r},
                   description=f"rows={rows}, hidden={H} bf16 ({rows * H * 2} bytes)")
