"""The simulator's runtime: memory model basics, shared-memory race detection, errors
(timeouts, deadlocks, faults, the step cap) and the multi-rank launcher."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import peerdsl.dsl as dsl
import peerdsl.sim
from peerdsl import layout
from peerdsl.runtime.errors import (CollectiveAborted, CollectiveTimeout, SimDeadlock, SimHang,
                                    SimMemoryFault)
from peerdsl.runtime.sim import SimSystem
from sim_kernels import run1


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
        comm.launch_ir(k_signal, dict(world=2), 2, dict(sig=comm.peer_signals, rank=comm.rank))
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
    # three ranks: the plain SimCommunicator (the collective one has no world-3 kernels)
    res = peerdsl.sim.run(3, fn, comm_cls=peerdsl.sim.SimCommunicator)
    addrs = [a for _, a, _ in res]
    assert all(r[0] == addrs for r in res)
    assert len({a >> 48 for a in addrs}) == 3  # the address names the device


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
            comm.launch_ir(k_signal, dict(world=2), 2, dict(sig=comm.peer_signals, rank=comm.rank),
                        delay=100 * comm.rank * i)
        comm.set_spin_limit(30)
        comm.delay = 4000 * comm.rank  # sticky: rank 1 arrives too late for rank 0's spin
        # rank 0 times out; its end arrival carries the abort mark, so rank 1 raises too
        with pytest.raises(CollectiveTimeout if comm.rank == 0 else CollectiveAborted):
            comm.launch_ir(k_signal, dict(world=2), 1, dict(sig=comm.peer_signals, rank=comm.rank))
        return comm.hello()
    assert peerdsl.sim.run(2, fn, skew=skew, comm_cls=MyComm) == ["rank 0", "rank 1"]
    assert seen == [0, 1, 2, 3]


def test_mismatched_collective_calls_are_an_error():
    def fn(comm):
        if comm.rank == 0:
            comm.barrier()
        else:
            comm.launch_ir(k_signal, dict(world=2), 1, dict(sig=comm.peer_signals, rank=1))
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
    from sim_kernels import two_block_sums
    x = torch.randn(128)
    with pytest.raises(SimRace, match="twin_scratch"):
        run1(two_block_sums.trace(first_barrier=first, second_barrier=second), {}, {"x": x},
             {"out": ((256,), torch.float32)})
    out = run1(two_block_sums.trace(), {}, {"x": x}, {"out": ((256,), torch.float32)})["out"]
    assert (out[:128] == out[0]).all() and (out[128:] == out[128]).all()
    assert torch.allclose(out[0], x.sum(), atol=1e-4)


def test_barrier_in_divergent_control_flow_is_an_error():
    from peerdsl.runtime.errors import SimError
    from sim_kernels import divergent_barrier
    run1(divergent_barrier.trace(uniform=True), {}, {}, {"out": ((64,), torch.int32)})
    with pytest.raises(SimError, match="only some threads"):
        run1(divergent_barrier.trace(uniform=False), {}, {}, {"out": ((64,), torch.int32)})
