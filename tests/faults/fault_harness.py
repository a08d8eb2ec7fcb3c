"""The fault-injection harness (issue 14): a plan of collective calls played on simulated
ranks, faults injected per rank, and the invariants every fault test asserts:

  1. every call either returns the exact reference (all_reduce / all_gather bitwise; the
     fused entry: residual_out bitwise, out within 1 ulp of the float64 reference) or raises
     a named error: a CollectiveError (timeout, mismatch, aborted, broken, closed), one of the
     simulator's rendezvous errors, or, for an input a test made bad on purpose, the
     ValueError/TypeError of the input checks. A memory fault, a deadlock, a hang or a wrong
     result fails the test (`corruptions` counts wrong results; it must stay 0);
  2. every call ends within the time bound (no hang);
  3. the rule after an error: once a rank raised a collective error, each of its later calls
     raises CommunicatorBroken (bad-input errors raised before any launch do not break it).

Inputs are a function of (plan seed, call index, rank), so each rank can compute the
reference of every agreed call. A call whose plan some rank changed (skipped, replaced, made
bad) has no reference: a result returned for it, or for any call after ranks fell out of step,
does not match and counts as a corruption.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable

import torch

import peerdsl.sim
from peerdsl.runtime import dispatch
from peerdsl.runtime.errors import (CollectiveError, CommunicatorBroken, SimAborted,
                                    SimCallMismatch, SimPeerGone, SimRendezvousTimeout)
from peerdsl.runtime.sim.collective_comm import SimCollectiveComm

NAMED = (CollectiveError, SimAborted, SimCallMismatch, SimPeerGone, SimRendezvousTimeout)
BAD_INPUT = (ValueError, TypeError)
RENDEZVOUS_S = 8.0
CALL_BOUND_S = RENDEZVOUS_S + 30.0  # a call's wall time: the rendezvous bound plus a launch
JOB = dict(ll_max_bytes=8192, staging_bytes=1 << 17, spin_limit=3000,
           rendezvous_timeout_s=RENDEZVOUS_S)
POOL_BYTES = 1 << 19
H = 2880
SKIP, BAD = "skip", "bad"
STATS: list[dict] = []   # one entry per case (tests/faults/conftest.py reports them)


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective call: kind 'ar' (all_reduce of n elements), 'ag' (all_gather of n),
    'fused' (fused_allreduce_rmsnorm of rows x hidden) or 'null'; `path` forces the fused
    path on the ranks that run this step (PEERDSL_FUSED_PATH, per rank)."""
    kind: str
    n: int = 0
    hidden: int = H
    dtype: torch.dtype = torch.bfloat16
    path: str | None = None

    def inputs(self, seed: int, index: int, rank: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + index * 101 + rank)
        if self.kind in ("ar", "ag"):
            return {"x": torch.randn(self.n, generator=g).to(self.dtype)}
        if self.kind == "fused":
            shape = (self.n, self.hidden)
            x = torch.randn(shape, generator=g).to(self.dtype)
            g0 = torch.Generator().manual_seed(seed * 7 + index)  # shared by every rank
            return {"x": x, "residual": torch.randn(shape, generator=g0).to(self.dtype),
                    "weight": (torch.rand(self.hidden, generator=g0) + 0.5).to(self.dtype)}
        return {}

    def call(self, comm: Any, inp: dict[str, torch.Tensor], bad: bool = False) -> Any:
        if self.kind == "null":
            return comm.null_collective()
        x = inp["x"]
        if bad:  # what a caller's bug looks like: a tensor the input checks refuse
            x = x.to(torch.float32)
        if self.kind == "ar":
            return comm.all_reduce(x)
        if self.kind == "ag":
            return comm.all_gather(x)
        with forced_path(self.path):
            res = comm.fused_allreduce_rmsnorm(x, inp["residual"], inp["weight"])
        return tuple(res)

    def matches(self, got: Any, every: list[dict[str, torch.Tensor]]) -> bool:
        """Whether `got` is the exact result of this step given every rank's inputs."""
        from reference import add_rmsnorm_f64, all_reduce_ref, ulp_diff
        if self.kind == "null":
            return got is None
        xs = [e["x"] for e in every]
        if self.kind == "ar":
            return _same(got, all_reduce_ref(xs))
        if self.kind == "ag":
            return _same(got, torch.stack(xs))
        ar = all_reduce_ref(xs)
        out, res_out = got
        ref_out, ref_res = add_rmsnorm_f64(ar, every[0]["residual"], every[0]["weight"])
        return _same(res_out, ref_res) and out.shape == ref_out.shape and \
            ulp_diff(out, ref_out) <= 1


def _same(a: Any, b: torch.Tensor) -> bool:
    return (isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


# ----------------------------------------------------------------------------- per-rank paths
_FORCED = threading.local()
_PLAN_LOCK = threading.Lock()  # the override goes through os.environ: one planner at a time
_real_plan = dispatch.plan_fused_ar_rms


def _plan_with_rank_override(*args: Any, **kwargs: Any) -> str:
    path = getattr(_FORCED, "path", None)
    if path is None:
        with _PLAN_LOCK:
            return _real_plan(*args, **kwargs)
    import os
    with _PLAN_LOCK:
        old = os.environ.get("PEERDSL_FUSED_PATH")
        os.environ["PEERDSL_FUSED_PATH"] = path   # read by the planner within this call only
        try:
            return _real_plan(*args, **kwargs)
        finally:
            if old is None:
                os.environ.pop("PEERDSL_FUSED_PATH", None)
            else:
                os.environ["PEERDSL_FUSED_PATH"] = old


class forced_path:
    """PEERDSL_FUSED_PATH for this rank's thread only (the simulated ranks share a process)."""

    def __init__(self, path: str | None):
        self.path = path

    def __enter__(self) -> None:
        _FORCED.path = self.path

    def __exit__(self, *exc: Any) -> None:
        _FORCED.path = None


dispatch.plan_fused_ar_rms = _plan_with_rank_override  # a no-op unless a rank forces a path


# ----------------------------------------------------------------------------- the comm
class FaultComm(SimCollectiveComm):
    """The simulator's communicator with a fixed-size input pool (as on a GPU: mismatched
    sizes are left to the device-side checks, not to the simulator's growing pool) and a
    per-rank launch hook a test may set: hook(comm, launch, name, constexprs, grid, args),
    where launch(args) performs the real collective launch."""

    hooks: dict[int, Callable] = {}

    def _stage(self, t: torch.Tensor) -> int:
        if self._pool is None:
            self._pool = self.alloc((POOL_BYTES,), torch.uint8, "input pool")
            self._pool_peers = self.register(self._pool)
            from peerdsl import layout
            self.copy_in(self._pool_table,
                         torch.tensor(layout.peer_row(self._pool_peers), dtype=torch.int64))
        return super()._stage(t)

    def _launch(self, name: str, constexprs: dict, grid: int, args: dict,
                local: bool = False) -> None:
        hook = type(self).hooks.get(self.rank) if not local else None
        if hook is None:
            return super()._launch(name, constexprs, grid, args, local)

        def launch(a: dict) -> None:
            SimCollectiveComm._launch(self, name, constexprs, grid, a, local)
        return hook(self, launch, name, constexprs, grid, args)


def comm_class(hooks: dict[int, Callable] | None = None) -> type:
    return type("FaultComm", (FaultComm,), {"hooks": dict(hooks or {})})


# ----------------------------------------------------------------------------- playing a plan
@dataclasses.dataclass
class Outcome:
    rank: int
    index: int
    status: str          # "exact", "wrong", "bad input" or the error's class name
    error: BaseException | None
    seconds: float


def play(comm: Any, steps: list[Step], seed: int, overrides: dict, before: Callable | None
         ) -> list[Outcome]:
    """Rank `comm.rank`'s calls: steps[i], or what overrides[(rank, i)] says (SKIP, BAD,
    another Step). Errors are recorded, not raised, except unnamed ones (they fail)."""
    out = []
    for i, step in enumerate(steps):
        mine = overrides.get((comm.rank, i), step)
        if mine == SKIP:
            continue
        if before is not None:
            before(comm, i)
        actual = step if mine == BAD else mine
        inp = actual.inputs(seed, i, comm.rank)
        t0 = time.monotonic()
        try:
            got = actual.call(comm, inp, bad=mine == BAD)
        except NAMED as e:
            out.append(Outcome(comm.rank, i, type(e).__name__, e, time.monotonic() - t0))
            continue
        except BAD_INPUT as e:
            if mine != BAD:
                raise
            out.append(Outcome(comm.rank, i, "bad input", e, time.monotonic() - t0))
            continue
        agreed = all(overrides.get((r, i), step) == step for r in range(comm.world))
        every = [step.inputs(seed, i, r) for r in range(comm.world)]
        ok = agreed and step.matches(got, every)
        out.append(Outcome(comm.rank, i, "exact" if ok else "wrong", None,
                           time.monotonic() - t0))
    return out


def run_case(case: str, tp: int, steps: list[Step], overrides: dict | None = None,
             seed: int = 1, hooks: dict | None = None, before: Callable | None = None,
             setup: Callable | None = None, **job: Any) -> list[list[Outcome]]:
    """Play `steps` on `tp` ranks with the faults given; check invariants 1-3; record the
    figures. Returns every rank's outcomes for the test's own expectations."""
    overrides = overrides or {}

    def body(comm: Any) -> list[Outcome]:
        if setup is not None:
            setup(comm)
        return play(comm, steps, seed, overrides, before)

    options = {**JOB, **job}
    sim_seed = options.pop("sim_seed", seed)
    results = peerdsl.sim.run(tp, body, seed=sim_seed, comm_cls=comm_class(hooks), **options)
    check_invariants(results)
    flat = [o for rank in results for o in rank]
    STATS.append({"case": case, "ranks": tp, "calls": len(flat),
                  "exact": sum(o.status == "exact" for o in flat),
                  "errors": sum(o.error is not None for o in flat),
                  "corruptions": sum(o.status == "wrong" for o in flat),
                  "error_kinds": sorted({o.status for o in flat if o.error is not None})})
    return results


def check_invariants(results: list[list[Outcome]]) -> None:
    for outcomes in results:
        broken = None
        for o in outcomes:
            where = f"rank {o.rank} call {o.index}"
            assert o.status != "wrong", f"{where}: a wrong result returned without an error"
            assert o.seconds < CALL_BOUND_S, f"{where} took {o.seconds:.1f} s"
            if broken is not None:
                assert isinstance(o.error, CommunicatorBroken), \
                    f"{where}: after {broken!r} expected CommunicatorBroken, got {o.status}"
            elif o.error is not None and o.status != "bad input":
                broken = o.error


def statuses(results: list[list[Outcome]]) -> list[list[str]]:
    return [[o.status for o in rank] for rank in results]


def first_errors(results: list[list[Outcome]]) -> list[str | None]:
    """Each rank's first collective error (class name), None if it had none."""
    return [next((o.status for o in rank if o.error is not None and o.status != "bad input"),
                 None) for rank in results]
