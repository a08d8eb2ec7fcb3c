"""`comm.prepare_fused_allreduce_rmsnorm`: the fused entry prepared once (runtime/prepared.py
says what a prepared call is and guarantees). Mirrors `Collectives.fused_allreduce_rmsnorm`
and `_fused` (collectives.py) path by path, with the tensors bound once."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..ops._rows import FLAG_FP8, FLAG_MIRROR
from . import dispatch
from .built import FUSED_LL_OP
from .callid import call_key
from .collectives import FP8_DTYPES, NormResult
from .fused_launch import fused_kernel, fused_ll, fused_ll_launch, gather_launch
from .prepared import (PreparedCall, agree, bind_entry, check_output, compile_call,
                       describe, finish, in_place_op, plain_each_call, usable)

__all__ = ["prepare_fused"]
ENTRY = "fused_allreduce_rmsnorm"
_OPTIONS = ("eps", "gemma_norm", "fp8_out", "bf16_mirror")


def _plan(comm: Any, x, residual, weight, args: tuple, kwargs: dict, out, residual_out
          ) -> tuple[str, tuple, int, float]:
    """The plain entry's checks and dispatch (no device work): (path, (rows, hidden, T),
    flags, eps)."""
    bound = bind_entry(comm, ENTRY, (x, residual, weight, *args), kwargs)
    unknown = sorted(set(bound) - {"self", "x", "residual", "weight", *_OPTIONS})
    if unknown:
        raise TypeError(f"prepare_{ENTRY} does not handle the options {unknown} yet")
    eps, gemma, fp8_out, mirror = (bound[k] for k in _OPTIONS)
    rows, hidden, T = comm._norm_checks(x, residual, weight, ENTRY)
    flags = comm._flags(gemma, fp8_out, mirror)
    inputs = (("x", x), ("residual", residual), ("weight", weight))
    check_output("out", out, x, (rows, hidden), inputs)
    check_output("residual_out", residual_out, x, (rows, hidden), inputs)
    if out is not None and flags & FLAG_FP8 and not flags & FLAG_MIRROR:
        raise ValueError("out= is the T output, which an fp8_out call returns only with "
                         "bf16_mirror=True; pass residual_out= alone")
    if rows == 0:
        return "empty", (rows, hidden, T), flags, float(eps)
    path = dispatch.plan_fused_ar_rms(comm.arch, comm.world, rows, hidden, x.dtype,
                                      bool(fp8_out), x.is_contiguous(),
                                      capacity=comm.capacity)
    if path == "ll+rmsnorm" and dispatch.plan_all_reduce(
            comm.arch, comm.world, rows * hidden * x.element_size(), True,
            comm.capacity) != "ll":
        path = "unfused"  # not reached with the shipped tables: the all-reduce is LL there
    return path, (rows, hidden, T), flags, float(eps)


def prepare_fused(comm: Any, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  args: tuple, kwargs: dict, out: torch.Tensor | None = None,
                  residual_out: torch.Tensor | None = None,
                  stage_input: bool = False) -> PreparedCall:
    usable(comm)
    b = comm._prepared_binder()
    failure = None
    try:
        b.ready(x)
        path, (rows, hidden, T), flags, eps = _plan(comm, x, residual, weight, args, kwargs,
                                                   out, residual_out)
    except Exception as e:  # noqa: BLE001 - sent to the peers, then raised here
        failure = e
    call_args = (x, residual, weight, *args)
    agree(comm, b, None if failure else describe(ENTRY, call_args, kwargs, path, stage_input),
          failure)
    shape = (rows, hidden)
    if path == "empty":  # as the plain call: a sequence number, no launch
        result = comm._empty_norm_result(x, hidden, flags)
        return PreparedCall(comm, ENTRY, path, result, compile_call(comm, path, result, []),
                            launches=0, fast=True)
    if path in ("unfused", "fallback"):
        return _plain_fused(comm, path, x, residual, weight, args, kwargs, flags, out,
                            residual_out)

    quant_after = (path.startswith("fused_") and flags & FLAG_FP8
                   and not dispatch.fp8_in_epilogue(comm.arch, rows, hidden, x.dtype))
    kflags = flags & ~(FLAG_FP8 | FLAG_MIRROR) if quant_after else flags
    residual_v, weight_v = b.tensor("residual", residual), b.tensor("weight", weight)
    vals, result = _outputs(comm, b.output, shape, x.dtype, kflags, out, residual_out)
    # the row kernels' variants as the plain call picks them: specialized or runtime-H
    norm = comm._row_kernel("add_rmsnorm", hidden)
    norm_name, norm_cx = norm.name, {"T": T, **norm.constexprs, "FP8": comm.fp8_format}
    norm_args = dict(residual=residual_v, weight=weight_v, rows=rows, eps=eps, flags=kflags)
    actions: list[tuple] = []
    if path == "local":
        actions.append(("local", b.launch(norm_name, norm_cx, comm._local_grid(rows),
                                          dict(x=b.tensor("x", x), **norm_args, **vals,
                                               **norm.args), local=True)))
    elif path == "ll+rmsnorm" and fused_ll(comm, hidden):  # one launch, x read in place here
        cx, grid = fused_ll_launch(comm, rows, hidden, T)  # only (as the LL kernel): plain tag
        args = dict(x=b.tensor("x", x), sig=comm.signal_peers, ll=comm.ll_peers,
                    rank=comm.rank, lines_per_peer=comm.ll_lines_per_peer, **norm_args, **vals)
        actions.append(("collective", b.launch(FUSED_LL_OP, cx, grid, args),
                        call_key(ENTRY, call_args, kwargs, FUSED_LL_OP, cx, comm.world),
                        b.check(FUSED_LL_OP)))
    elif path == "ll+rmsnorm":  # the LL kernel reads x here only: the plain call's tag
        packs = rows * hidden * x.element_size() // 16
        ar = b.scratch(shape, x.dtype)
        cx = {"T": T, "W": comm.world}
        ll_args = {"x": b.tensor("x", x), "out": ar, "sig": comm.signal_peers,
                   "ll": comm.ll_peers, "rank": comm.rank, "n_packs": packs,
                   "lines_per_peer": comm.ll_lines_per_peer}
        actions.append(("collective", b.launch("allreduce_ll", cx, comm._grid(packs), ll_args),
                        call_key(ENTRY, call_args, kwargs, "allreduce_ll", cx, comm.world),
                        b.check("allreduce_ll")))
        actions.append(("local", b.launch(norm_name, norm_cx, comm._local_grid(rows),
                                          dict(x=ar, **norm_args, **vals, **norm.args),
                                          local=True)))
    else:
        rk, name, cx, grid = fused_kernel(comm, path, rows, hidden, T)
        inp = b.registered(x, stage_input)
        op = ENTRY if stage_input else in_place_op(comm, ENTRY)
        fused_args = dict(inp=inp, sig=comm.signal_peers, rank=comm.rank, **norm_args, **vals,
                          **rk.args)
        if path == "fused_2stage":
            fused_args["staging"] = comm.staging_peers
        actions.append(("collective", b.launch(name, cx, grid, fused_args),
                        call_key(op, call_args, kwargs, name, cx, comm.world), b.check(name)))
        if cx.get("S"):  # stage 1 alone: the gather launch does stage 2
            g_name, g_cx, g_args = gather_launch(
                comm, comm._row_kernel("fused_ar_rms_gather", hidden), T, fused_args)
            actions.append(("local", b.launch(g_name, g_cx, comm._local_grid(rows), g_args,
                                              local=True)))
        if quant_after:
            q_v, q_t = b.output(None, shape, torch.int8)
            s_v, s_t = b.output(None, (rows, 1), torch.float32)
            quant = comm._row_kernel("per_token_quant_fp8", hidden)
            actions.append(("local", b.launch(
                quant.name, {"T": T, **quant.constexprs, "FP8": comm.fp8_format},
                comm._local_grid(rows),
                {"x": vals["out"], "q": q_v, "scale": s_v, "rows": rows, **quant.args},
                local=True)))
            result = NormResult(None, result.residual_out,
                                q_t.view(FP8_DTYPES[comm.fp8_format]), s_t,
                                result.out if flags & FLAG_MIRROR else None)
    return finish(comm, ENTRY, path, result, b, actions)


def _outputs(comm: Any, make: Callable, shape: tuple, dtype: torch.dtype, flags: int,
             out: torch.Tensor | None, residual_out: torch.Tensor | None
             ) -> tuple[dict[str, Any], NormResult]:
    """The kernel's output values and the NormResult the call returns (what _norm_outputs
    and _norm_result of collectives.py make), through `make(given, shape, dtype)`."""
    out_v, out_t = make(out, shape, dtype)
    res_v, res_t = make(residual_out, shape, dtype)
    if not flags & FLAG_FP8:
        return ({"out": out_v, "residual_out": res_v, "q": 0, "scale": 0},
                NormResult(out_t, res_t))
    q_v, q_t = make(None, shape, torch.int8)
    s_v, s_t = make(None, (shape[0], 1), torch.float32)
    result = NormResult(None, res_t, q_t.view(FP8_DTYPES[comm.fp8_format]), s_t,
                        out_t if flags & FLAG_MIRROR else None)
    return {"out": out_v, "residual_out": res_v, "q": q_v, "scale": s_v}, result


def _plain_fused(comm: Any, path: str, x, residual, weight, args, kwargs, flags: int, out,
                 residual_out) -> PreparedCall:
    def make(given, shape, dtype):
        t = given if given is not None else torch.empty(shape, dtype=dtype, device=x.device)
        return t, t
    _, result = _outputs(comm, make, tuple(x.shape), x.dtype, flags, out, residual_out)

    def copy(got: NormResult) -> None:
        for field in result._fields:
            getattr(result, field).copy_(getattr(got, field))
    return plain_each_call(
        comm, ENTRY, path,
        lambda: comm.fused_allreduce_rmsnorm(x, residual, weight, *args, **kwargs), result,
        copy)
