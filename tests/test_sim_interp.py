"""Bit-exact semantics of the simulator's interpreter (dsl/ir.py docstring), memory model
basics, and its error reporting (timeouts, deadlocks, faults, the step cap)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import peerdsl.dsl as dsl
import peerdsl.sim
from peerdsl import layout
from peerdsl.runtime.errors import (CollectiveTimeout, SimDeadlock, SimHang, SimMemoryFault)
from peerdsl.runtime.sim import SimSystem

N = 256


def run1(kernel, args: dict, inputs: dict, outputs: dict, grid: int = 1, seed=None):
    """Launch on one simulated device; inputs: name -> tensor; outputs: name -> (shape, dtype)."""
    dev = SimSystem(1).devices[0]
    bufs = {k: dev.to_device(v) for k, v in inputs.items()}
    bufs.update({k: dev.alloc_tensor(s, d) for k, (s, d) in outputs.items()})
    dev.launch(kernel, grid, {**args, **bufs}, seed=seed)
    return {k: dev.to_torch(bufs[k]) for k in outputs}


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
def k_fp8(x: dsl.Ptr[dsl.f32], out: dsl.Ptr[dsl.i8], n: dsl.i32, fmt: dsl.constexpr):
    for i in range(dsl.thread_id(), n, dsl.block_size()):
        out[i] = dsl.to_fp8(x[i], fmt)


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


def test_to_fp8_nan_clamps_to_max():
    for fmt, code in (("e4m3fn", 0x7E), ("e4m3fnuz", 0x7F)):
        x = torch.tensor([float("nan")] * 4)
        got = run1(k_fp8.trace(fmt=fmt), {"n": 4}, {"x": x}, {"out": ((4,), torch.int8)})["out"]
        assert got.tolist() == [code] * 4


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


# ----------------------------------------------------------------------------- memory

@dsl.kernel(block_size=256)
def k_atomics(ctr: dsl.Ptr[dsl.i32], olds: dsl.Ptr[dsl.i32], scratch: dsl.Ptr[dsl.i32]):
    t = dsl.thread_id()
    olds[t] = dsl.atomic_add(ctr, 1, "agent")
    scratch[t] = t * 3
    olds[256 + t] = scratch[255 - t]  # own pending stores are visible to the block


def test_atomics_serialize_lanes_and_own_stores_are_visible():
    got = run1(k_atomics.trace(), {}, {}, {"ctr": ((1,), torch.int32),
                                            "olds": ((512,), torch.int32),
                                            "scratch": ((256,), torch.int32)}, seed=5)
    assert got["ctr"].item() == 256
    assert sorted(got["olds"][:256].tolist()) == list(range(256))
    assert got["olds"][256:].tolist() == [(255 - t) * 3 for t in range(256)]


@dsl.kernel(block_size=32)
def k_oob(p: dsl.Ptr[dsl.f32], n: dsl.i32):
    p[dsl.thread_id() + n] = 1.0


def test_out_of_bounds_store_faults():
    dev = SimSystem(1).devices[0]
    buf = dev.alloc(64)
    with pytest.raises(SimMemoryFault, match="past its end"):
        dev.launch(k_oob.trace(), 1, {"p": buf, "n": 8})
    with pytest.raises(SimMemoryFault, match="not an allocated"):
        dev.launch(k_oob.trace(), 1, {"p": 0, "n": 0})


@dsl.kernel(block_size=64)
def k_signal(sig: dsl.PeerPtrs[dsl.i32], rank: dsl.i32, world: dsl.constexpr):
    s = dsl.Signal(sig, rank, world)
    s.start()
    s.end()


def test_missing_peer_times_out_with_its_record():
    def fn(comm):
        comm.set_spin_limit(200)
        if comm.rank == 0:  # rank 1 never launches: rank 0's start barrier expires
            with pytest.raises(CollectiveTimeout) as info:
                comm.launch_local(k_signal, dict(world=2), 1,
                                  dict(sig=comm.peer_signals, rank=0))
            e = info.value
            assert (e.rank, e.block, e.what, e.expected, e.seen) == (0, 0, layout.WAIT_START, 1, 0)
            assert "start barrier" in str(e)
        comm.barrier()
        return True
    assert peerdsl.sim.run(2, fn, seed=1) == [True, True]


def test_skew_delays_a_rank_past_the_spin_limit():
    def fn(comm):
        comm.set_spin_limit(50)
        comm.launch(k_signal, dict(world=2), 2, dict(sig=comm.peer_signals, rank=comm.rank))
    peerdsl.sim.run(2, fn, seed=0, skew=[0, 0])  # fine without skew
    with pytest.raises(CollectiveTimeout) as info:
        peerdsl.sim.run(2, fn, seed=0, skew=[0, 5000])
    assert info.value.rank == 0 and info.value.what == layout.WAIT_START


def test_deadlock_is_reported_with_the_waited_address():
    def fn(comm):
        comm.set_spin_limit(10**9)
        if comm.rank == 0:
            comm.launch_local(k_signal, dict(world=2), 1, dict(sig=comm.peer_signals, rank=0))
    with pytest.raises(SimDeadlock) as info:
        peerdsl.sim.run(2, fn, seed=2, deadlock_steps=2000)
    msg = str(info.value)
    assert "rank 0 meta+" in msg and "polls" in msg and " lt 1" in msg, msg
    assert info.value.waiters[0]["rank"] == 0


def test_step_cap_stops_a_livelock():
    def fn(comm):
        comm.set_spin_limit(10**9)
        if comm.rank == 0:
            comm.launch_local(k_signal, dict(world=2), 1, dict(sig=comm.peer_signals, rank=0))
    with pytest.raises(SimHang):
        peerdsl.sim.run(2, fn, seed=None, max_steps=3000, deadlock_steps=10**9)


def test_targets_expose_wave_and_fp8_format():
    def fn(comm):
        return comm.device.wave_size, comm.fp8_format, comm.target
    assert peerdsl.sim.run(1, fn, target="gfx942") == [(64, "e4m3fnuz", "gfx942")]
    assert peerdsl.sim.run(1, fn) == [(32, "e4m3fn", "gfx1250")]


def test_register_and_exchange_give_every_rank_all_addresses():
    def fn(comm):
        buf = comm.alloc((4,), torch.float32)
        return comm.register(buf), buf.addr, comm.peer_meta
    res = peerdsl.sim.run(3, fn)
    addrs = [a for _, a, _ in res]
    assert all(r[0] == addrs for r in res)
    assert len({a >> 48 for a in addrs}) == 3  # the address names the device


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_round_robin_skew_callable_per_launch_delay_and_comm_cls():
    class MyComm(peerdsl.sim.SimCommunicator):
        def hello(self):
            return f"rank {self.rank}"

    seen = []

    def skew(i):
        seen.append(i)
        return [0, 10 * i]

    def fn(comm):
        for i in range(3):
            comm.launch(k_signal, dict(world=2), 2, dict(sig=comm.peer_signals, rank=comm.rank),
                        delay=100 * comm.rank * i)
        comm.set_spin_limit(30)
        comm.delay = 4000 * comm.rank  # sticky: rank 1 arrives too late for rank 0's spin
        with pytest.raises(CollectiveTimeout) if comm.rank == 0 else _nothing():
            comm.launch(k_signal, dict(world=2), 1, dict(sig=comm.peer_signals, rank=comm.rank))
        return comm.hello()
    assert peerdsl.sim.run(2, fn, skew=skew, comm_cls=MyComm) == ["rank 0", "rank 1"]
    assert seen == [0, 1, 2, 3]


def test_mismatched_collective_calls_are_an_error():
    def fn(comm):
        if comm.rank == 0:
            comm.barrier()
        else:
            comm.launch(k_signal, dict(world=2), 1, dict(sig=comm.peer_signals, rank=1))
    with pytest.raises(Exception, match="different collective calls"):
        peerdsl.sim.run(2, fn)


def test_rank_returning_early_does_not_hang_the_others():
    def fn(comm):
        if comm.rank == 1:
            comm.barrier()
    with pytest.raises(Exception, match="never made"):
        peerdsl.sim.run(2, fn)


def test_division_cases_undefined_in_llvm_are_defined_like_the_lowering():
    from peerdsl.runtime.sim.numerics import int_div, int_rem
    for dt in (np.int8, np.int32, np.int64):
        mn = np.iinfo(dt).min
        a = np.array([mn, mn, 7, -7, 5], dt)
        b = np.array([-1, 0, 0, 0, -1], dt)
        assert int_div(a, b).tolist() == [mn, 0, 0, 0, -5]
        assert int_rem(a, b).tolist() == [0, 0, 0, 0, 0]


def test_memory_model_levels():
    """Block buffer -> device level (agent scope) -> memory (system scope), as weak.py says."""
    from peerdsl.runtime.sim.weak import BLOCK, DEVICE, MEMORY, WeakMemory

    class Ctx:
        def __init__(self, rank):
            self.rank, self.pending = rank, []

    mem = WeakMemory()
    a = mem.allocate(1, 64, "x")
    w, same, other = Ctx(0), Ctx(0), Ctx(1)
    i32 = np.dtype(np.int32)

    def seen(ctx, off=0):
        return int(mem.load(ctx, np.array([a.addr + off]), i32, 0)[0])

    mem.store(w, np.array([a.addr]), np.array([7], np.int32), BLOCK)
    assert (seen(w), seen(same), seen(other)) == (7, 0, 0)      # only the writer
    mem.drain(w, "agent")
    assert (seen(w), seen(same), seen(other)) == (7, 7, 0)      # its device, not rank 1
    mem.store(w, np.array([a.addr + 4]), np.array([9], np.int32), DEVICE)
    mem.drain(w, "system")
    assert (seen(other), seen(other, 4)) == (7, 9)              # L2 write-back: everyone
    mem.store(w, np.array([a.addr]), np.array([1], np.int32), BLOCK)
    mem.store(w, np.array([a.addr]), np.array([2], np.int32), BLOCK)
    mem.flush(w, w.pending[1])  # landing the later store lands the earlier one first
    assert seen(other) == 2 and all(e.state == MEMORY for e in w.pending)
    old = mem.atomic(other, np.array([a.addr] * 3), lambda o, v: o + v,
                     np.array([1, 1, 1], np.int32), i32)
    assert old.tolist() == [2, 3, 4] and seen(w) == 5


@pytest.mark.parametrize("first,second", [(False, True), (True, False)])
def test_missing_shared_memory_barrier_is_a_race(first, second):
    from peerdsl.runtime.errors import SimRace
    from tests.sim_kernels import two_block_sums
    x = torch.randn(128)
    with pytest.raises(SimRace, match="twin_scratch"):
        run1(two_block_sums.trace(first_barrier=first, second_barrier=second), {}, {"x": x},
             {"out": ((256,), torch.float32)})
    out = run1(two_block_sums.trace(), {}, {"x": x}, {"out": ((256,), torch.float32)})["out"]
    assert (out[:128] == out[0]).all() and (out[128:] == out[128]).all()
    assert torch.allclose(out[0], x.sum(), atol=1e-4)


def test_barrier_in_divergent_control_flow_is_an_error():
    from peerdsl.runtime.errors import SimError
    from tests.sim_kernels import divergent_barrier
    run1(divergent_barrier.trace(uniform=True), {}, {}, {"out": ((64,), torch.int32)})
    with pytest.raises(SimError, match="only some threads"):
        run1(divergent_barrier.trace(uniform=False), {}, {}, {"out": ((64,), torch.int32)})
