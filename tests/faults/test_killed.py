"""A rank killed mid-call: its thread raises inside a collective (before its launch, or
after its kernel died half way), or stops there for longer than the rendezvous timeout. Its
peers raise a named error within the bound (SimAborted, SimRendezvousTimeout, or the
kernel's CollectiveTimeout when the dead rank's kernel stopped after its start barrier) and
refuse every later call."""
from __future__ import annotations

import time

import pytest

from fault_harness import RENDEZVOUS_S, Step, first_errors, run_case, statuses
from peerdsl import dsl
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from peerdsl.runtime.errors import SimAborted

STEPS = [Step("fused", 3, path="fused_2stage")] * 4


class Killed(SimAborted):
    """Stands for the death of a rank's thread: the harness records it like any error."""


def _nth_launch(n: int, action):
    count = [0]

    def hook(comm, launch, name, constexprs, grid, args):
        count[0] += 1
        if count[0] == n:
            return action(comm, launch, name, constexprs, grid, args)
        return launch(args)
    return hook


def _die(comm, launch, name, constexprs, grid, args):
    comm.job.fail(Killed(f"rank {comm.rank} killed inside {name}"))
    raise Killed(f"rank {comm.rank} killed inside {name}")


def test_a_thread_that_dies_inside_a_collective():
    res = run_case("rank 1 dies inside a collective (TP4)", 4, STEPS, hooks={1: _nth_launch(2, _die)})
    first = first_errors(res)
    assert first[1] == "Killed" and all(f == "SimAborted" for r, f in enumerate(first) if r != 1)


def test_a_thread_that_stops_inside_a_collective():
    def stall(comm, launch, name, constexprs, grid, args):
        time.sleep(2 * RENDEZVOUS_S / 4)
        return launch(args)
    t0 = time.monotonic()
    res = run_case("rank 1 stalls past the rendezvous timeout (TP2)", 2,
                   [Step("ar", 1024)] * 3, hooks={1: _nth_launch(2, stall)},
                   rendezvous_timeout_s=RENDEZVOUS_S / 4)
    first = first_errors(res)
    assert first[0] == "SimRendezvousTimeout", statuses(res)
    assert first[1] in ("SimRendezvousTimeout", "SimPeerGone"), statuses(res)
    assert time.monotonic() - t0 < 4 * RENDEZVOUS_S


@dsl.kernel(block_size="B")
def _dies_after_start(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"], residual: Ptr["T"],
                      weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"], q: Ptr[dsl.i8],
                      scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32], rank: dsl.i32,
                      rows: dsl.i32, eps: dsl.f32, flags: dsl.i32, call: dsl.CallId,
                      T: constexpr, H: constexpr, W: constexpr, FP8: constexpr,
                      B: constexpr = 256):
    """The two-stage fused kernel of a rank that dies right after its start barrier (B: the
    norm kernels' threads a row, which the runtime names)."""
    s = dsl.Signal(sig, rank, W, call=call)
    s.start()
    s.finish()


def test_a_kernel_that_dies_after_its_start_barrier():
    def dead_kernel(comm, launch, name, constexprs, grid, args):
        args["call"] = comm._call_id_for(name, constexprs, args)  # as the real launch would
        raw = getattr(comm, "launch_ir", comm.launch)  # the raw primitive ([launch] renames it)
        raw(_dies_after_start, constexprs, grid, args)
        _die(comm, launch, name, constexprs, grid, args)
    res = run_case("rank 1's kernel dies after its start barrier (TP4)", 4, STEPS,
                   hooks={1: _nth_launch(2, dead_kernel)})
    first = first_errors(res)
    assert first[1] == "Killed"
    assert all(f == "CollectiveTimeout" for r, f in enumerate(first) if r != 1), statuses(res)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_returns_early(rank):
    """A rank that stops making calls (its program ended): the peer's next call raises."""
    from fault_harness import SKIP
    res = run_case(f"rank {rank} returns after one call (TP2)", 2, [Step("ar", 1024)] * 3,
                   {(rank, 1): SKIP, (rank, 2): SKIP})
    assert first_errors(res)[1 - rank] == "SimPeerGone"
