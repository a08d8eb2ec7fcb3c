"""SPEC section 2 on the edges (issue 14 item 7), on the simulator: rows holding NaN, +inf,
-inf, huge values (the f32 sum of squares overflows), tiny values and zeros. Fused == unfused
byte for byte on every path, and both equal to torch's unfused reference (tests/reference.py):
NaN and inf propagate as there, FP8 bytes and scales byte for byte."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import peerdsl.dsl as dsl
import peerdsl.sim
from peerdsl.lowering import mlir_gen, pipeline
from reference import add_rmsnorm_f64, all_reduce_ref, quant_fp8_ref, ulp_diff
from sim_kernels import run1

NAN, INF = float("nan"), float("inf")
PATHS = ("unfused", "ll+rmsnorm", "fused_1stage", "fused_2stage")


def edge_rows(hidden: int, dtype: torch.dtype, tp: int = 2, seed: int = 0):
    """(xs per rank, residual, weight, names): one case per row."""
    g = torch.Generator().manual_seed(seed)
    rows = {}

    def row(name, xs, res):
        rows[name] = ([x.clone() for x in xs], res.clone())

    def randn(scale=1.0):
        return torch.randn(hidden, generator=g) * scale

    z = torch.zeros(hidden)
    huge = 1e20 if dtype == torch.bfloat16 else 60000.0  # f16: the largest finite magnitudes
    top = 3e38 if dtype == torch.bfloat16 else 65504.0
    tiny = 1e-30 if dtype == torch.bfloat16 else 1e-7   # f16: subnormal
    row("normal", [randn() for _ in range(tp)], randn())
    row("all huge", [z] * tp, torch.full((hidden,), huge))         # squares overflow f32
    row("all top", [torch.full((hidden,), top)] + [z] * (tp - 1), z)  # RMS near FLT_MAX
    one_huge = randn()
    one_huge[hidden // 3] = huge
    row("one huge", [randn() for _ in range(tp)], one_huge)
    x_nan = [randn() for _ in range(tp)]
    x_nan[1][5] = NAN
    row("nan", x_nan, randn())
    res_inf, res_ninf = randn(), randn()
    res_inf[7], res_ninf[hidden - 1] = INF, -INF
    row("+inf", [randn() for _ in range(tp)], res_inf)
    row("-inf", [randn() for _ in range(tp)], res_ninf)
    row("sum overflows", [torch.full((hidden,), top)] * tp, z)      # all-reduce gives inf
    row("tiny", [randn(tiny) for _ in range(tp)], randn(tiny))
    row("zero", [z] * tp, z)
    names = list(rows)
    xs = [torch.stack([rows[n][0][r] for n in names]).to(dtype) for r in range(tp)]
    residual = torch.stack([rows[n][1] for n in names]).to(dtype)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(dtype)
    weight[3] = -weight[3]  # a negative weight: signed zeros in the inf rows
    return xs, residual, weight, names


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def same_or_both_nan(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.float(), b.float()
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def run_path(monkeypatch, tp, xs, residual, weight, path, **kw):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", path)

    def body(comm):
        res = comm.fused_allreduce_rmsnorm(xs[comm.rank], residual, weight, **kw)
        assert comm.last_path == path
        return [t.clone() for t in res]

    results = peerdsl.sim.run(tp, body, seed=5)
    for r in results[1:]:  # every rank the same bytes
        assert all(torch.equal(bits(a), bits(b)) for a, b in zip(results[0], r))
    return results[0]


CASES = [  # (dtype, hidden, options)
    (torch.bfloat16, 2880, {}),
    (torch.bfloat16, 2880, {"fp8_out": True, "bf16_mirror": True, "gemma_norm": True}),
    (torch.bfloat16, 6144, {"fp8_out": True}),
    (torch.float16, 2880, {"gemma_norm": True}),
    (torch.float16, 4096, {"fp8_out": True, "bf16_mirror": True}),
]


@pytest.mark.parametrize("dtype,hidden,opts", CASES,
                         ids=lambda v: str(v).replace("torch.", "") if not isinstance(v, dict)
                         else "-".join(k for k in v) or "plain")
def test_edge_rows_fused_equal_unfused_equal_torch(monkeypatch, dtype, hidden, opts):
    tp = 2
    xs, residual, weight, names = edge_rows(hidden, dtype, tp)
    base = run_path(monkeypatch, tp, xs, residual, weight, "unfused", **opts)
    for path in PATHS[1:]:
        got = run_path(monkeypatch, tp, xs, residual, weight, path, **opts)
        for a, b in zip(base, got):
            assert torch.equal(bits(a), bits(b)), path  # NaN payloads included

    gemma = opts.get("gemma_norm", False)
    ar = all_reduce_ref(xs)
    out_ref, res_ref = add_rmsnorm_f64(ar, residual, weight, gemma_norm=gemma)
    residual_out = base[1]
    assert same_or_both_nan(residual_out, res_ref)
    if opts.get("fp8_out"):
        q, scale = base[0], base[2]
        out = base[3] if opts.get("bf16_mirror") else None
    else:
        out, q, scale = base[0], None, None
    if out is None:  # the T output this FP8 came from: the same call without FP8
        out = run_path(monkeypatch, tp, xs, residual, weight, "unfused", gemma_norm=gemma)[0]
    for i, name in enumerate(names):
        assert torch.equal(torch.isnan(out[i]), torch.isnan(out_ref[i])), name
        finite = ~torch.isnan(out_ref[i])
        assert ulp_diff(out[i][finite], out_ref[i][finite]) <= 1, name
    # the overflow regression: rows of 1e20 (bf16) normalize to the weight, not to 0
    assert (out[names.index("all huge")].float() != 0).all()
    assert (out[names.index("all top")].float() != 0).all()
    if q is not None:
        q_ref, s_ref = quant_fp8_ref(out, "e4m3fn")
        assert torch.equal(bits(q), bits(q_ref))
        assert torch.equal(bits(scale), bits(s_ref))  # NaN scales: torch's 0x7FC00000
        nan_row = names.index("nan")
        assert torch.isnan(scale[nan_row]).all() and (bits(q[nan_row]) != 0x7E).all()
        assert float(scale[names.index("zero")]) == 0.0 and not bits(q[-1]).any()


QUANT_ROWS = {
    "nan": lambda r: r.__setitem__(9, NAN),
    "neg nan": lambda r: r.__setitem__(9, -NAN),
    "+inf": lambda r: r.__setitem__(4, INF),
    "-inf": lambda r: r.__setitem__(4, -INF),
    "inf and nan": lambda r: (r.__setitem__(1, INF), r.__setitem__(2, NAN)),
    "+-inf": lambda r: (r.__setitem__(1, INF), r.__setitem__(2, -INF)),
    "subnormal scale": lambda r: r.mul_(1e-38),
    "huge": lambda r: r.mul_(1e36),
    "zero": lambda r: r.zero_(),
}


@pytest.mark.parametrize("target,fmt", [("gfx1250", "e4m3fn"), ("gfx942", "e4m3fnuz")])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_per_token_quant_of_nan_and_inf_rows_matches_torch(target, fmt, dtype):
    hidden = 2880
    g = torch.Generator().manual_seed(1)
    rows = []
    for fill in QUANT_ROWS.values():
        r = torch.randn(hidden, generator=g)
        r[0], r[3] = 0.0, -0.0
        fill(r)
        rows.append(r)
    x = torch.stack(rows).to(dtype)

    q, scale = peerdsl.sim.run(1, lambda comm: comm.per_token_quant_fp8(x), target=target)[0]
    q_ref, s_ref = quant_fp8_ref(x, fmt)
    for i, name in enumerate(QUANT_ROWS):
        assert torch.equal(bits(q[i]), bits(q_ref[i])), name
        assert torch.equal(bits(scale[i]), bits(s_ref[i])), name


@dsl.kernel(block_size=256)
def k_maxes(x: dsl.Ptr[dsl.f32], y: dsl.Ptr[dsl.f32], out: dsl.Ptr[dsl.f32],
            bmax: dsl.Ptr[dsl.f32]):
    t = dsl.thread_id()
    out[t] = dsl.fmaximum(x[t], y[t])
    bmax[t] = dsl.block_max(x[t])


def test_fmaximum_propagates_nan_and_orders_signed_zeros():
    x = torch.tensor([NAN, 1.0, -0.0, 0.0, -0.0, -INF, 2.0, NAN] * 32)
    y = torch.tensor([1.0, NAN, 0.0, -0.0, -0.0, -1.0, INF, -NAN] * 32)
    out = run1(k_maxes.trace(), {}, {"x": x, "y": y},
               {"out": ((256,), torch.float32), "bmax": ((256,), torch.float32)})
    want = torch.tensor([NAN, NAN, 0.0, 0.0, -0.0, -1.0, INF, NAN] * 32)  # IEEE maximum
    got = out["out"]
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    keep = ~torch.isnan(want)
    assert torch.equal(bits(got[keep]), bits(want[keep]))  # +0 above -0 (torch.maximum: -0)
    assert torch.isnan(out["bmax"]).all()  # a NaN on any thread: the block's max is NaN
    finite = torch.arange(256, dtype=torch.float32)
    got = run1(k_maxes.trace(), {}, {"x": finite, "y": finite},
               {"out": ((256,), torch.float32), "bmax": ((256,), torch.float32)})
    assert (got["bmax"] == 255.0).all()


def test_fmaximum_lowers_to_one_nan_propagating_instruction():
    k = k_maxes.trace()
    text, _ = mlir_gen.generate(k, "gfx1250", "m")
    assert '"llvm.maximum.f32"' in text
    assert "v_maximum" in pipeline.compile_kernel(k, "gfx1250", "m").isa
    assert "max.NaN.f32" in pipeline.compile_kernel(k, "sm_90", "m").isa


def test_rescaled_inverse_rms_matches_float64_across_binades():
    """The overflow path alone: rows whose largest value sits in every top binade of bf16."""
    hidden = 4096
    rows = []
    for e in range(64, 128):
        r = torch.linspace(-1.0, 1.0, hidden) * 2.0 ** e
        r[hidden // 2] = 1.9 * 2.0 ** e  # the row's maximum, just below the next binade
        rows.append(r)
    x = torch.stack(rows).to(torch.bfloat16)
    assert not torch.isinf(x).any()
    res = torch.zeros_like(x)
    w = torch.ones(hidden, dtype=torch.bfloat16)
    out = peerdsl.sim.run(1, lambda comm: comm.add_rmsnorm(x, res, w).out)[0]
    ref, _ = add_rmsnorm_f64(x, res, w)
    assert ulp_diff(out, ref) <= 1
    assert np.isfinite(out.float().numpy()).all()
