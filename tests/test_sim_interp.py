"""Bit-exact semantics of the simulator's interpreter (dsl/ir.py docstring): conversions,
FP8, integer and float ops, shuffles, block reductions, divergent control flow."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import peerdsl.dsl as dsl
from sim_kernels import run1

N = 256


def _f32_edge_values(rng: np.random.Generator, n: int) -> np.ndarray:
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    vals = bits.view(np.float32)
    # halfway cases for bf16 (low 16 bits 0x8000) and f16, subnormals, infinities
    half = (bits & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    edge = np.array([0.0, -0.0, np.inf, -np.inf, 65504.0, 65520.0, 65519.99, 6e-8, 3e-8,
                     2.98e-8, 1e-40, -1e-40, 3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8], np.float32)
    return np.concatenate([vals, half.view(np.float32), edge]).astype(np.float32)


@dsl.kernel(block_size=256)
def k_convert(x: dsl.Ptr[dsl.f32], ob: dsl.Ptr[dsl.bf16], oh: dsl.Ptr[dsl.f16],
              back: dsl.Ptr[dsl.f32], n: dsl.i32):
    for i in range(dsl.thread_id(), n, dsl.block_size()):
        v = x[i]
        ob[i] = v.to_bf16()
        oh[i] = v.to_f16()
        back[i] = v.to_bf16().to_f32()


def test_bf16_f16_round_to_nearest_even_matches_torch():
    vals = _f32_edge_values(np.random.default_rng(0), 4000)
    vals = vals[~np.isnan(vals)]
    n = len(vals)
    x = torch.from_numpy(vals)
    out = run1(k_convert.trace(), {"n": n}, {"x": x},
               {"ob": ((n,), torch.bfloat16), "oh": ((n,), torch.float16),
                "back": ((n,), torch.float32)})
    assert torch.equal(out["ob"].view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    assert torch.equal(out["oh"].view(torch.int16), x.to(torch.float16).view(torch.int16))
    assert torch.equal(out["back"], x.to(torch.bfloat16).float())


@dsl.kernel(block_size=256)
def k_fp8(x: dsl.Ptr[dsl.f32], out: dsl.Ptr[dsl.i8], n: dsl.i32, fmt: dsl.constexpr,
          finite: dsl.constexpr = False):
    for i in range(dsl.thread_id(), n, dsl.block_size()):
        out[i] = dsl.to_fp8(x[i], fmt, finite=finite)


@pytest.mark.parametrize("fmt,tdt", [("e4m3fn", torch.float8_e4m3fn),
                                     ("e4m3fnuz", torch.float8_e4m3fnuz)])
def test_to_fp8_matches_torch_after_clamp(fmt, tdt):
    fmax = dsl.FP8_MAX[fmt]
    rng = np.random.default_rng(1)
    grid = torch.arange(256, dtype=torch.uint8).view(tdt).float()
    grid = grid[~torch.isnan(grid)].numpy()
    g = np.unique(grid)
    halfway = ((g[:-1].astype(np.float64) + g[1:]) / 2).astype(np.float32)
    vals = np.concatenate([
        rng.standard_normal(3000).astype(np.float32) * np.float32(fmax / 4),
        rng.standard_normal(1000).astype(np.float32) * np.float32(0.02),
        (rng.standard_normal(500) * 1e-3).astype(np.float32),
        g, halfway, -halfway, np.nextafter(halfway, np.float32(np.inf)),
        np.nextafter(halfway, np.float32(-np.inf)),
        np.array([0.0, -0.0, fmax, -fmax, fmax * 2, -fmax * 2, np.inf, -np.inf, 1e-30, -1e-30],
                 np.float32)]).astype(np.float32)
    n = len(vals)
    x = torch.from_numpy(vals)
    got = run1(k_fp8.trace(fmt=fmt), {"n": n}, {"x": x}, {"out": ((n,), torch.int8)})["out"]
    # torch: RNE; e4m3fn saturates but e4m3fnuz overflows to NaN, so compare after clamping
    ref = x.clamp(-fmax, fmax).to(tdt).view(torch.int8)
    bad = (got != ref).nonzero().flatten()
    assert len(bad) == 0, [(float(x[i]), int(got[i]), int(ref[i])) for i in bad[:8]]


def test_to_fp8_nan_is_the_nan_byte_whatever_its_sign_and_payload():
    # +NaN, -NaN, payloads: torch's clamp(...).to(fp8) of a positive NaN, on every NaN
    x = torch.tensor([0x7FC00000, -0x00400000, 0x7F800001, -0x007FFFFF],
                     dtype=torch.int32).view(torch.float32)
    for fmt, tdt in (("e4m3fn", torch.float8_e4m3fn), ("e4m3fnuz", torch.float8_e4m3fnuz)):
        got = run1(k_fp8.trace(fmt=fmt), {"n": 4}, {"x": x}, {"out": ((4,), torch.int8)})["out"]
        want = torch.tensor([float("nan")]).to(tdt).view(torch.int8)
        assert got.tolist() == [int(want)] * 4, fmt
        # finite=True promises no NaN; a NaN then clamps to FP8_MAX's byte (maxNum/minNum),
        # which the per-token quant's non-finite-row fix-up relies on
        got = run1(k_fp8.trace(fmt=fmt, finite=True), {"n": 4}, {"x": x},
                   {"out": ((4,), torch.int8)})["out"]
        assert got.tolist() == [0x7E if fmt == "e4m3fn" else 0x7F] * 4


@dsl.kernel(block_size=256)
def k_intops(a: dsl.Ptr[dsl.i32], b: dsl.Ptr[dsl.i32], q: dsl.Ptr[dsl.i32],
             r: dsl.Ptr[dsl.i32], sh: dsl.Ptr[dsl.i32], wide: dsl.Ptr[dsl.i64], n: dsl.i32):
    for i in range(dsl.thread_id(), n, dsl.block_size()):
        x = a[i]
        y = b[i]
        q[i] = x // y
        r[i] = x % y
        sh[i] = (x >> 3) + (x << 29)
        wide[i] = x.to_i64() * y.to_i64() + x.zext(dsl.i64)


def test_signed_div_rem_truncate_and_shifts_wrap():
    rng = np.random.default_rng(2)
    a = rng.integers(-2**31 + 1, 2**31 - 1, 2000).astype(np.int32)
    b = rng.integers(-50, 50, 2000).astype(np.int32)
    b[b == 0] = 7
    a[:4] = [-7, 7, -7, 7]
    b[:4] = [2, -2, -2, 2]
    n = len(a)
    out = run1(k_intops.trace(), {"n": n}, {"a": torch.from_numpy(a), "b": torch.from_numpy(b)},
               {k: ((n,), torch.int32) for k in ("q", "r", "sh")} | {"wide": ((n,), torch.int64)})
    q_ref = [int(math.copysign(abs(int(x)) // abs(int(y)), int(x) * int(y))) for x, y in zip(a, b)]
    assert out["q"].tolist() == q_ref
    assert out["r"].tolist() == [int(x) - qq * int(y) for x, y, qq in zip(a, b, q_ref)]
    assert out["q"][:4].tolist() == [-3, -3, 3, 3] and out["r"][:4].tolist() == [-1, 1, -1, 1]
    u = a.view(np.uint32).astype(np.uint64)
    sh = ((u >> 3) + ((u << 29) & 0xFFFFFFFF)) & 0xFFFFFFFF  # logical shr, wrapping shl/add
    assert out["sh"].numpy().view(np.uint32).tolist() == sh.astype(np.uint32).tolist()
    wide = a.astype(np.int64) * b.astype(np.int64) + u.astype(np.int64)
    assert out["wide"].tolist() == wide.tolist()


@dsl.kernel(block_size=64)
def k_shfl(x: dsl.Ptr[dsl.f32], out: dsl.Ptr[dsl.f32], mask: dsl.constexpr, width: dsl.constexpr):
    t = dsl.thread_id()
    out[t] = dsl.shfl_xor(x[t], mask, width)


@pytest.mark.parametrize("mask,width", [(1, 32), (16, 32), (5, 8), (2, 4), (31, 32)])
def test_shfl_xor_within_groups(mask, width):
    x = torch.arange(64, dtype=torch.float32) * 1.5
    got = run1(k_shfl.trace(mask=mask, width=width), {}, {"x": x},
               {"out": ((64,), torch.float32)})["out"]
    lanes = np.arange(64)
    assert torch.equal(got, x[torch.from_numpy(lanes ^ mask)])
    assert ((lanes ^ mask) // width == lanes // width).all()


@dsl.kernel(block_size=256)
def k_block_sum(x: dsl.Ptr[dsl.f32], out: dsl.Ptr[dsl.f32], mx: dsl.Ptr[dsl.f32]):
    t = dsl.thread_id()
    v = x[t]
    out[t] = dsl.block_sum(v * v)
    mx[t] = dsl.block_max(v)


def test_block_sum_same_bits_on_every_thread_in_the_documented_order():
    x = torch.randn(256, generator=torch.Generator().manual_seed(3))
    out = run1(k_block_sum.trace(), {}, {"x": x},
               {"out": ((256,), torch.float32), "mx": ((256,), torch.float32)})
    s = (x * x).numpy().astype(np.float32)
    for m in (16, 8, 4, 2, 1):  # butterfly inside each 32-lane group
        s = (s + s[np.arange(256) ^ m]).astype(np.float32)
    total = s[0]
    for g in range(1, 8):  # then the group partials, serially in group order
        total = np.float32(total + s[32 * g])
    assert (out["out"] == float(total)).all()
    assert (out["mx"] == x.max()).all()


@dsl.kernel(block_size=64)
def k_divergent(out: dsl.Ptr[dsl.i32], trips: dsl.Ptr[dsl.i32]):
    t = dsl.thread_id()
    if t % 2 == 0:
        v = t * 10
        if t % 4 == 0:
            v = v + 1
    else:
        v = -t
    n = 0
    k = t
    while k > 0:  # per-lane trip count (Collatz-like halving)
        k = k // 2
        n = n + 1
    acc = 0
    for j in range(t % 5, 9, 2):
        acc = acc + j
    out[t] = v + acc * 1000
    trips[t] = n


def test_divergent_if_and_loops_merge_per_lane():
    got = run1(k_divergent.trace(), {}, {}, {"out": ((64,), torch.int32),
                                              "trips": ((64,), torch.int32)})
    exp, trips = [], []
    for t in range(64):
        v = (t * 10 + (1 if t % 4 == 0 else 0)) if t % 2 == 0 else -t
        exp.append(v + sum(range(t % 5, 9, 2)) * 1000)
        trips.append(t.bit_length())
    assert got["out"].tolist() == exp
    assert got["trips"].tolist() == trips


@dsl.kernel(block_size=64)
def k_float_ops(a: dsl.Ptr[dsl.f32], b: dsl.Ptr[dsl.f32], c: dsl.Ptr[dsl.f32],
                o: dsl.Ptr[dsl.f32], n: dsl.i32):
    for i in range(dsl.thread_id(), n, dsl.block_size()):
        x, y, z = a[i], b[i], c[i]
        o[6 * i] = dsl.rsqrt(dsl.abs(x))
        o[6 * i + 1] = dsl.fma(x, y, z)
        o[6 * i + 2] = x * y + z
        o[6 * i + 3] = dsl.maximum(x, y)
        o[6 * i + 4] = dsl.rcp(y)
        o[6 * i + 5] = (x * 1000.0).to_i32().to_f32()


def test_float_ops_round_as_documented():
    rng = np.random.default_rng(4)
    n = 500
    a, b, c = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    b[:3] = [np.nan, 1.0, -2.5]
    a[:3] = [1.0, np.nan, 2.0]
    out = run1(k_float_ops.trace(), {"n": n},
               {"a": torch.from_numpy(a), "b": torch.from_numpy(b), "c": torch.from_numpy(c)},
               {"o": ((6 * n,), torch.float32)})["o"].numpy().reshape(n, 6)
    one = np.float32(1)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(out[:, 0], one / np.sqrt(np.abs(a)))
        fin = np.isfinite(a) & np.isfinite(b)
        exact = [_round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
                 for x, y, z in zip(a[fin], b[fin], c[fin])]
        np.testing.assert_array_equal(out[fin, 1], np.array(exact, np.float32))
        np.testing.assert_array_equal(out[:, 2], (a * b).astype(np.float32) + c)
        np.testing.assert_array_equal(out[:, 3], np.fmax(a, b))  # NaN operand loses
        np.testing.assert_array_equal(out[:, 4], one / b)
        fin = np.isfinite(a)  # fptosi of NaN is undefined
        np.testing.assert_array_equal(out[fin, 5],
                                      np.trunc(a[fin] * np.float32(1000)).astype(np.float32))


def _round_f32(q: Fraction) -> np.float32:
    """Correct round-to-nearest-even of an exact rational to f32."""
    f = np.float32(float(q))
    cands = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    cands = [x for x in cands if np.isfinite(x)]
    best = min(cands, key=lambda x: (abs(Fraction(float(x)) - q),
                                     int(np.array(x).view(np.int32)) & 1))
    return np.float32(best)


def test_fma_single_rounding_where_double_rounding_differs():
    from peerdsl.runtime.sim.numerics import fma_f32
    rng = np.random.default_rng(9)
    # products with long tails, c chosen so that the f64 sum sits near an f32 halfway point
    a = (1 + rng.integers(1, 2**23, 20000) * 2.0**-23).astype(np.float32)
    b = (1 + rng.integers(1, 2**23, 20000) * 2.0**-23).astype(np.float32)
    c = (-(a.astype(np.float64) * b)).astype(np.float32)
    got = fma_f32(a, b, c)
    exact = [_round_f32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
             for x, y, z in zip(a[:3000], b[:3000], c[:3000])]
    np.testing.assert_array_equal(got[:3000], np.array(exact, np.float32))
    hard = np.array([1 + 2**-23], np.float32), np.array([1 - 2**-24], np.float32)
    q = Fraction(float(hard[0][0])) * Fraction(float(hard[1][0])) + Fraction(2**-60)
    assert fma_f32(hard[0], hard[1], np.array([2**-60], np.float32))[0] == _round_f32(q)
