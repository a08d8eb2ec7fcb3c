"""Prepared collective calls (issue 15): an eager call's host work paid once, not per call.

    prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, eps=1e-6)
    for layer in ...:
        x.copy_(...)                  # or compute into x: each call reads the bound tensors
        out, residual_out = prep()    # the same NormResult (the same tensors) every call

`comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, *args, out=None,
residual_out=None, stage_input=False, **kwargs)` (prepared_fused.py) and
`comm.prepare_all_reduce(x, out=None, stage_input=False)` check the inputs as the plain
entry does, pick the path (dispatch, with the PEERDSL_* environment as it is now), allocate
the outputs once (or take `out=` / `residual_out=`, which must not overlap an input), bind
every tensor by address and, on the GPU, pack each kernel's arguments once
(cuda/prepared_launch.py). A call `prep()` then refuses when the communicator is broken or
closed, takes the next sequence number, writes the call tag into the packed bytes and
launches: one driver call per kernel, no torch operation and no Python-level check on the GPU.

Issue 14's guarantees hold: one sequence number per call, errors mark the communicator
broken, calls after close() raise CommunicatorClosed. A prepared call runs the kernels the
plain call of the same arguments runs; its call tag is the plain call's where it reads its
input as the plain call does (`stage_input=True`, and the LL paths, whose kernels read the
input locally), so ranks may mix those with plain calls. Read in place (the default on the
one- and two-stage paths), the input a peer reads is the bound tensor of the same prepared
call on every rank, not the registered pool: that call's tag names it (`op[prepared #n,
input in place]`, n counting such preparations, which every rank makes in the same order),
so a rank making another call at that point raises CollectiveMismatch instead of reading
the wrong memory.

Contract:
- Preparing is collective on every backend: every rank prepares the same calls in the same
  order. The ranks first exchange what they prepare (a rank whose inputs fail the checks
  raises its error, its peers a RuntimeError naming it; ranks preparing different calls
  raise ValueError), then an input read in place is shared with the peers once (its
  registration lasts until `comm.close()`).
- Each call reads the bound tensors as they are then and overwrites the outputs of the
  previous call: copy a result out before the next call if it must survive it.
- The path, grid and kernels are fixed when preparing; paths with no prepared form (the
  torch.distributed fallback, a non-contiguous input) make each call the plain call,
  copying its result into the bound outputs (`prep.fast` is False for those).
- One thread at a time per communicator, as for plain calls.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from .. import layout
from . import dispatch
from .callid import SEQ_MULT, call_key, code_of, describe_key
from .collectives import DTYPES, check_tensor

__all__ = ["PreparedCall", "prepare_all_reduce"]
_SEQ_MASK = 0xFFFFFFFF


class PreparedCall:
    """A collective call prepared once (see the module docstring): call it with no
    arguments; it returns `result`, whose tensors every call overwrites."""

    def __init__(self, comm: Any, op: str, path: str, result: Any, run: Callable[[], Any],
                 launches: int, fast: bool, keep: tuple = ()):
        self.comm, self.op, self.path, self.result = comm, op, path, result
        self.launches = launches  # kernel launches per call
        self.fast = fast          # False: each call is the plain call (a fallback path)
        self._run = run
        self._keep = keep         # what the bound addresses point into

    def __call__(self) -> Any:
        return self._run()

    def __repr__(self) -> str:
        return (f"PreparedCall({self.op}, path {self.path}, {self.launches} launch"
                f"{'es' if self.launches != 1 else ''} per call, rank {self.comm.rank})")


# ------------------------------------------------------------------ the per-call closures

def compile_call(comm: Any, path: str, result: Any, actions: list[tuple]) -> Callable[[], Any]:
    """The closure a prepared call runs. `actions`, in order: ("collective", go, key,
    check) launches `go(tag)` with the tag of call description `key`, then runs `check`
    (or None); ("local", go) launches `go()`; ("step", fn) runs `fn()`."""
    log = comm._call_log.recent  # the communicator's record of tags, for error messages
    if len(actions) == 1 and actions[0][0] == "collective" and actions[0][3] is None:
        # the common GPU case: one collective kernel, nothing else per call
        _, go, key, _ = actions[0]
        code = code_of(key)

        def run_one() -> Any:
            if comm._closed or comm._broken is not None:
                comm._refuse()
            seq = comm._seq = (comm._seq + 1) & _SEQ_MASK
            tag = ((seq * SEQ_MULT) ^ code) & layout.TAG_MASK
            log.append((seq, tag, key))
            try:
                go(tag)
            except BaseException as e:
                comm._mark_broken(e)
                raise
            comm.last_path = path
            return result
        return run_one

    steps: list[Callable[[int], Any]] = []
    for action in actions:
        if action[0] == "collective":
            steps.append(_collective_step(action[1], action[2], log))
            if action[3] is not None:
                steps.append(lambda seq, check=action[3]: check())
        else:
            steps.append(lambda seq, fn=action[1]: fn())

    def run() -> Any:
        if comm._closed or comm._broken is not None:
            comm._refuse()
        seq = comm._seq = (comm._seq + 1) & _SEQ_MASK
        try:
            for step in steps:
                step(seq)
        except BaseException as e:
            comm._mark_broken(e)
            raise
        comm.last_path = path
        return result
    return run


def _collective_step(go: Callable[[int], None], key: tuple, log: Any) -> Callable[[int], None]:
    code = code_of(key)

    def step(seq: int) -> None:
        tag = ((seq * SEQ_MULT) ^ code) & layout.TAG_MASK
        log.append((seq, tag, key))
        go(tag)
    return step


def plain_each_call(comm: Any, op: str, path: str, entry: Callable[[], Any], result: Any,
                    copy: Callable[[Any], None]) -> PreparedCall:
    """A path with no prepared form: each call is the plain call (which takes its own
    sequence number), its result copied into the bound outputs."""
    def run() -> Any:
        copy(entry())
        return result
    return PreparedCall(comm, op, path, result, run, launches=0, fast=False)


# ------------------------------------------------------------------ argument checks

def usable(comm: Any) -> None:
    """Refuse at once on a broken or closed communicator, before the ranks' exchange (as
    every call after an error or close() is refused before it does anything)."""
    if comm._closed or comm._broken is not None:
        comm._refuse()


def agree(comm: Any, b: Any, what: Any, failure: BaseException | None) -> None:
    """The exchange every preparation starts with (collective): this rank's description of
    the call it prepares, or its failure. Raises on every rank when one failed (its own
    error there) or when the ranks prepare different calls."""
    mine = ("failed", f"rank {comm.rank}: {type(failure).__name__}: {failure}") \
        if failure is not None else ("ok", what)
    everyone = b.exchange(mine)
    if failure is not None:
        raise failure
    failed = [text for status, text in everyone if status == "failed"]
    if failed:
        raise RuntimeError(f"preparing the call failed on {len(failed)} rank(s), so no rank "
                           "prepared it: " + "; ".join(failed))
    differ = [r for r, (_, theirs) in enumerate(everyone) if theirs != what]
    if differ:
        raise ValueError(f"ranks prepared different calls: rank {comm.rank} "
                         f"{describe_key(what)}, rank {differ[0]} "
                         f"{describe_key(everyone[differ[0]][1])}; every rank must prepare "
                         "the same calls in the same order")


def describe(op: str, args: tuple, kwargs: dict, path: str, stage_input: bool) -> tuple:
    """What the ranks compare when preparing (picklable: dtypes, shapes, plain values)."""
    return call_key(op, args, kwargs, path, {"stage_input": stage_input}, 0)


def in_place_op(comm: Any, op: str) -> str:
    """The op name in the call tags of a prepared call that reads its input in place (see
    the module docstring): numbered in preparation order, the same on every rank."""
    n = comm.__dict__.get("_prepared_in_place", 0) + 1
    comm.__dict__["_prepared_in_place"] = n
    return f"{op}[prepared #{n}, input in place]"


def bind_entry(comm: Any, entry: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The plain entry's arguments as Python binds them (its defaults applied)."""
    sig = inspect.signature(getattr(type(comm), entry))
    try:
        bound = sig.bind(comm, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"prepare_{entry}: {e} (it takes {entry}'s arguments)") from None
    bound.apply_defaults()
    return bound.arguments


def check_output(name: str, t: torch.Tensor | None, like: torch.Tensor, shape: tuple,
                  inputs: tuple) -> None:
    if t is None:
        return
    check_tensor(name, t, like.dtype, shape)
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but x is on {like.device}")
    for other_name, other in inputs:
        if _overlap(t, other):
            raise ValueError(f"{name} overlaps {other_name}: a prepared call's outputs must "
                             "be memory of their own (the kernels read every input while "
                             "they write the outputs)")


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device or not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.numel() * b.element_size() and b0 < a0 + a.numel() * a.element_size()


# ------------------------------------------------------------------ all-reduce

def prepare_all_reduce(comm: Any, x: torch.Tensor, out: torch.Tensor | None = None,
                       stage_input: bool = False) -> PreparedCall:
    """`comm.prepare_all_reduce`: see the module docstring."""
    entry = "all_reduce"
    usable(comm)
    b = comm._prepared_binder()
    path, failure = "", None
    try:
        b.ready(x)
        check_tensor("x", x, contiguous=False)
        check_output("out", out, x, tuple(x.shape), (("x", x),))
        nbytes = x.numel() * x.element_size()
        path = "empty" if nbytes == 0 else dispatch.plan_all_reduce(
            comm.arch, comm.world, nbytes, x.is_contiguous(), comm.capacity)
    except Exception as e:  # noqa: BLE001 - sent to the peers, then raised here
        failure = e
    agree(comm, b, None if failure else describe(entry, (x,), {}, path, stage_input), failure)
    shape = tuple(x.shape)
    if path == "empty":
        result = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        return PreparedCall(comm, entry, path, result, compile_call(comm, path, result, []),
                            launches=0, fast=True)
    if path in ("local", "fallback"):
        result = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        return plain_each_call(comm, entry, path, lambda: comm.all_reduce(x), result,
                               result.copy_)
    out_v, result = b.output(out, shape, x.dtype)
    cx = {"T": DTYPES[x.dtype], "W": comm.world}
    packs = nbytes // 16
    op = entry
    if path == "ll":
        name, grid = "allreduce_ll", comm._grid(packs)
        args = {"x": b.tensor("x", x), "out": out_v, "sig": comm.signal_peers,
                "ll": comm.ll_peers, "rank": comm.rank, "n_packs": packs,
                "lines_per_peer": comm.ll_lines_per_peer}
    else:
        inp = b.registered(x, stage_input)
        op = entry if stage_input else in_place_op(comm, entry)
        # the variant the plain call launches (dispatch.ar_kernel), so the tags agree too
        if path == "1stage":
            variant, per_block = dispatch.ar_kernel(comm.arch, path, comm.world, packs,
                                                    comm.max_grid)
            cx.update(variant)
            name, grid = "allreduce_1stage", comm._grid(packs, per_block)
            args = {"inp": inp, "out": out_v, "sig": comm.signal_peers, "rank": comm.rank,
                    "n_packs": packs}
        else:
            shard = packs // comm.world
            variant, per_block = dispatch.ar_kernel(comm.arch, path, comm.world, shard,
                                                    comm.max_grid)
            cx.update(variant)
            name, grid = "allreduce_2stage", comm._grid(shard, per_block)
            args = {"inp": inp, "staging": comm.staging_peers, "out": out_v,
                    "sig": comm.signal_peers, "rank": comm.rank, "shard_packs": shard}
    key = call_key(op, (x,), {}, name, cx, comm.world)
    return finish(comm, entry, path, result, b,
                  [("collective", b.launch(name, cx, grid, args), key, b.check(name))])


def finish(comm: Any, op: str, path: str, result: Any, b: Any,
           actions: list[tuple]) -> PreparedCall:
    """The PreparedCall of `actions` with the binder's per-call steps around them."""
    actions = ([("step", s) for s in b.before] + actions + [("step", s) for s in b.after])
    launches = sum(a[0] in ("collective", "local") for a in actions)
    return PreparedCall(comm, op, path, result, compile_call(comm, path, result, actions),
                        launches, fast=True, keep=tuple(b.keep))
