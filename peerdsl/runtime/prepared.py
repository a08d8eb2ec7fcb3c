"""Prepared collective calls (issue 15): an eager call's host work paid once, not per call.

    prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, eps=1e-6)
    for layer in ...:
        x.copy_(...)                  # or compute into x: each call reads the bound tensors
        out, residual_out = prep()    # the same NormResult (the same tensors) every call

`comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, *args, out=None,
residual_out=None, stage_input=False, **kwargs)` and `comm.prepare_all_reduce(x, out=None,
stage_input=False)` check the inputs as the plain entry does, pick the path (dispatch, with
the PEERDSL_* environment as it is now), allocate the outputs once (or take `out=` /
`residual_out=`, which must not overlap an input), bind every tensor by address and, on the
GPU, pack each kernel's arguments once (cuda/prepared_launch.py). A call `prep()` then
refuses when the communicator is broken or closed, takes the next sequence number, writes
the call tag into the packed bytes and launches: one driver call per kernel, no torch
operation and no Python-level check on the GPU.

A prepared call IS the plain call `fused_allreduce_rmsnorm(x, residual, weight, *args,
**kwargs)` (or `all_reduce(x)`) made again, for issue 14's guarantees: one sequence number
per call, the same call tags and kernels (ranks may mix prepared and plain calls of the same
arguments), errors mark the communicator broken, calls after close() raise
CommunicatorClosed.

Contract:
- Preparing is collective on every backend (every rank prepares the same calls in the same
  order): the bound input is shared with the peers once and read in place at each call
  (its registration lasts until `comm.close()`). `stage_input=True` copies it into the
  registered pool at each call instead, as plain eager calls do (one device copy more).
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
from ..ops._rows import FLAG_FP8, FLAG_MIRROR
from . import dispatch
from .callid import SEQ_MULT, call_key, code_of
from .collectives import DTYPES, FP8_DTYPES, NormResult, check_tensor

__all__ = ["PreparedCall", "prepare_fused", "prepare_all_reduce"]
_SEQ_MASK = 0xFFFFFFFF
_FUSED_OPTIONS = ("eps", "gemma_norm", "fp8_out", "bf16_mirror")


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

def _compile(comm: Any, path: str, result: Any, actions: list[tuple]) -> Callable[[], Any]:
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


def _plain(comm: Any, op: str, path: str, entry: Callable[[], Any], result: Any,
           copy: Callable[[Any], None]) -> PreparedCall:
    """A path with no prepared form: each call is the plain call (which takes its own
    sequence number), its result copied into the bound outputs."""
    def run() -> Any:
        copy(entry())
        return result
    return PreparedCall(comm, op, path, result, run, launches=0, fast=False)


# ------------------------------------------------------------------ argument checks

def _usable(comm: Any) -> None:
    if comm._closed or comm._broken is not None:
        comm._refuse()


def _bind(comm: Any, entry: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The plain entry's arguments as Python binds them (its defaults applied)."""
    sig = inspect.signature(getattr(type(comm), entry))
    try:
        bound = sig.bind(comm, *args, **kwargs)
    except TypeError as e:
        raise TypeError(f"prepare_{entry}: {e} (it takes {entry}'s arguments)") from None
    bound.apply_defaults()
    return bound.arguments


def _check_output(name: str, t: torch.Tensor | None, like: torch.Tensor, shape: tuple,
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


# ------------------------------------------------------------------ fused all-reduce + RMSNorm

def prepare_fused(comm: Any, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  args: tuple, kwargs: dict, out: torch.Tensor | None = None,
                  residual_out: torch.Tensor | None = None,
                  stage_input: bool = False) -> PreparedCall:
    """`comm.prepare_fused_allreduce_rmsnorm`: see the module docstring."""
    entry = "fused_allreduce_rmsnorm"
    _usable(comm)
    bound = _bind(comm, entry, (x, residual, weight, *args), kwargs)
    unknown = sorted(set(bound) - {"self", "x", "residual", "weight", *_FUSED_OPTIONS})
    if unknown:
        raise TypeError(f"prepare_{entry} does not handle the options {unknown} yet")
    eps, gemma, fp8_out, mirror = (bound[k] for k in _FUSED_OPTIONS)
    rows, hidden, T = comm._norm_checks(x, residual, weight, entry)
    flags = comm._flags(gemma, fp8_out, mirror)
    eps = float(eps)
    shape = (rows, hidden)
    inputs = (("x", x), ("residual", residual), ("weight", weight))
    _check_output("out", out, x, shape, inputs)
    _check_output("residual_out", residual_out, x, shape, inputs)
    if out is not None and flags & FLAG_FP8 and not flags & FLAG_MIRROR:
        raise ValueError("out= is the T output, which an fp8_out call returns only with "
                         "bf16_mirror=True; pass residual_out= alone")
    if rows == 0:  # as the plain call: a sequence number, no launch
        result = comm._empty_norm_result(x, hidden, flags)
        return PreparedCall(comm, entry, "empty", result, _compile(comm, "empty", result, []),
                            launches=0, fast=True)
    path = dispatch.plan_fused_ar_rms(comm.arch, comm.world, rows, hidden, x.dtype, fp8_out,
                                      x.is_contiguous(), capacity=comm.capacity)
    nbytes = rows * hidden * x.element_size()
    if path == "ll+rmsnorm" and dispatch.plan_all_reduce(
            comm.arch, comm.world, nbytes, True, comm.capacity) != "ll":
        path = "unfused"  # not reached with the shipped tables: the all-reduce is LL there
    if path in ("unfused", "fallback") or (path == "ll+rmsnorm" and not x.is_contiguous()):
        return _plain_fused(comm, entry, path, x, residual, weight, args, kwargs, flags,
                            out, residual_out)

    b = comm._prepared_binder()
    quant_after = (path.startswith("fused_") and fp8_out
                   and not dispatch.fp8_in_epilogue(comm.arch, rows, hidden, x.dtype))
    kflags = flags & ~(FLAG_FP8 | FLAG_MIRROR) if quant_after else flags
    residual_v, weight_v = b.tensor("residual", residual), b.tensor("weight", weight)
    vals, result = _norm_outputs(comm, b.output, shape, x.dtype, kflags, out, residual_out)
    norm_cx = {"T": T, "H": hidden, "FP8": comm.fp8_format}
    norm_args = dict(residual=residual_v, weight=weight_v, rows=rows, eps=eps, flags=kflags)

    def key(kernel: str, cx: dict) -> tuple:
        return call_key(entry, (x, residual, weight, *args), kwargs, kernel, cx, comm.world)
    actions: list[tuple] = []
    if path == "local":
        actions.append(("local", b.launch("add_rmsnorm", norm_cx, comm._local_grid(rows),
                                          dict(x=b.tensor("x", x), **norm_args, **vals),
                                          local=True)))
    elif path == "ll+rmsnorm":
        packs = nbytes // 16
        ar = b.scratch(shape, x.dtype)
        cx = {"T": T, "W": comm.world}
        ll_args = {"x": b.tensor("x", x), "out": ar, "sig": comm.signal_peers,
                   "ll": comm.ll_peers, "rank": comm.rank, "n_packs": packs,
                   "lines_per_peer": comm.ll_lines_per_peer}
        actions.append(("collective", b.launch("allreduce_ll", cx, comm._grid(packs), ll_args),
                        key("allreduce_ll", cx), b.check("allreduce_ll")))
        actions.append(("local", b.launch("add_rmsnorm", norm_cx, comm._local_grid(rows),
                                          dict(x=ar, **norm_args, **vals), local=True)))
    else:
        name = path.replace("fused_", "fused_ar_rms_")
        cx = {"T": T, "H": hidden, "W": comm.world, "FP8": comm.fp8_format}
        fused_args = dict(inp=b.registered(x, stage_input), sig=comm.signal_peers,
                          rank=comm.rank, **norm_args, **vals)
        if path == "fused_2stage":
            fused_args["staging"] = comm.staging_peers
        grid = max(1, min(rows, comm.max_grid, layout.MAX_BLOCKS))
        actions.append(("collective", b.launch(name, cx, grid, fused_args), key(name, cx),
                        b.check(name)))
        if quant_after:
            q_v, q_t = b.output(None, shape, torch.int8)
            s_v, s_t = b.output(None, (rows, 1), torch.float32)
            actions.append(("local", b.launch(
                "per_token_quant_fp8", norm_cx, comm._local_grid(rows),
                {"x": vals["out"], "q": q_v, "scale": s_v, "rows": rows}, local=True)))
            result = NormResult(None, result.residual_out,
                                q_t.view(FP8_DTYPES[comm.fp8_format]), s_t,
                                result.out if mirror else None)
    return _finish(comm, entry, path, result, b, actions)


def _norm_outputs(comm: Any, make: Callable, shape: tuple, dtype: torch.dtype, flags: int,
                  out: torch.Tensor | None, residual_out: torch.Tensor | None
                  ) -> tuple[dict[str, Any], NormResult]:
    """The kernel's output values and the NormResult the call returns (as _norm_outputs and
    _norm_result of collectives.py make them), through `make(given, shape, dtype)`."""
    out_v, out_t = make(out, shape, dtype)
    res_v, res_t = make(residual_out, shape, dtype)
    if not flags & FLAG_FP8:
        return {"out": out_v, "residual_out": res_v, "q": 0, "scale": 0}, NormResult(out_t,
                                                                                    res_t)
    q_v, q_t = make(None, shape, torch.int8)
    s_v, s_t = make(None, (shape[0], 1), torch.float32)
    result = NormResult(None, res_t, q_t.view(FP8_DTYPES[comm.fp8_format]), s_t,
                        out_t if flags & FLAG_MIRROR else None)
    return {"out": out_v, "residual_out": res_v, "q": q_v, "scale": s_v}, result


def _plain_fused(comm: Any, entry: str, path: str, x, residual, weight, args, kwargs,
                 flags: int, out, residual_out) -> PreparedCall:
    def make(given, shape, dtype):
        t = given if given is not None else torch.empty(shape, dtype=dtype, device=x.device)
        return t, t
    _, result = _norm_outputs(comm, make, tuple(x.shape), x.dtype, flags, out, residual_out)

    def copy(got: NormResult) -> None:
        for field in result._fields:
            getattr(result, field).copy_(getattr(got, field))
    return _plain(comm, entry, path,
                  lambda: comm.fused_allreduce_rmsnorm(x, residual, weight, *args, **kwargs),
                  result, copy)


# ------------------------------------------------------------------ all-reduce

def prepare_all_reduce(comm: Any, x: torch.Tensor, out: torch.Tensor | None = None,
                       stage_input: bool = False) -> PreparedCall:
    """`comm.prepare_all_reduce`: see the module docstring."""
    entry = "all_reduce"
    _usable(comm)
    check_tensor("x", x, contiguous=False)
    shape = tuple(x.shape)
    _check_output("out", out, x, shape, (("x", x),))
    if x.numel() == 0:
        result = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        return PreparedCall(comm, entry, "empty", result, _compile(comm, "empty", result, []),
                            launches=0, fast=True)
    nbytes = x.numel() * x.element_size()
    path = dispatch.plan_all_reduce(comm.arch, comm.world, nbytes, x.is_contiguous(),
                                    comm.capacity)
    if path in ("local", "fallback"):
        result = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
        return _plain(comm, entry, path, lambda: comm.all_reduce(x), result, result.copy_)
    b = comm._prepared_binder()
    out_v, result = b.output(out, shape, x.dtype)
    cx = {"T": DTYPES[x.dtype], "W": comm.world}
    packs = nbytes // 16
    if path == "ll":
        name, grid = "allreduce_ll", comm._grid(packs)
        args = {"x": b.tensor("x", x), "out": out_v, "sig": comm.signal_peers,
                "ll": comm.ll_peers, "rank": comm.rank, "n_packs": packs,
                "lines_per_peer": comm.ll_lines_per_peer}
    elif path == "1stage":
        name, grid = "allreduce_1stage", comm._grid(packs)
        args = {"inp": b.registered(x, stage_input), "out": out_v, "sig": comm.signal_peers,
                "rank": comm.rank, "n_packs": packs}
    else:
        shard = packs // comm.world
        name, grid = "allreduce_2stage", comm._grid(shard)
        args = {"inp": b.registered(x, stage_input), "staging": comm.staging_peers,
                "out": out_v, "sig": comm.signal_peers, "rank": comm.rank,
                "shard_packs": shard}
    key = call_key(entry, (x,), {}, name, cx, comm.world)
    return _finish(comm, entry, path, result, b,
                   [("collective", b.launch(name, cx, grid, args), key, b.check(name))])


def _finish(comm: Any, op: str, path: str, result: Any, b: Any,
            actions: list[tuple]) -> PreparedCall:
    actions = ([("step", s) for s in b.before] + actions + [("step", s) for s in b.after])
    launches = sum(a[0] in ("collective", "local") for a in actions)
    return PreparedCall(comm, op, path, result, _compile(comm, path, result, actions),
                        launches, fast=True, keep=tuple(b.keep))
