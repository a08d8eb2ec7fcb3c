"""What a fused all-reduce + RMSNorm launch runs, shared by the plain call
(collectives.py `_fused`) and the prepared one (prepared_fused.py): the kernel variant, its
constexprs and grid, the gather launch after a split two-stage kernel, and the ll+rmsnorm
path's one launch where it is built."""
from __future__ import annotations

from typing import Any

from .. import layout
from ..ops._row_slots import NORM_BLOCK
from . import dispatch
from .built import FUSED_LL_OP, ROWS_OP, RowKernel


def fused_kernel(comm: Any, path: str, rows: int, hidden: int, T: Any
                 ) -> tuple[RowKernel, str, dict, int]:
    """(RowKernel, kernel name, constexprs, grid) of a fused path's launch: the two-stage
    kernel with its schedule, or the one-stage kernel, with V rows per block iteration where
    dispatch asks for them and they are built (a build from before `fused_ar_rms_1stage_rows`
    launches the plain kernel: the same bytes). Cached per communicator on every input, the
    PEERDSL_* environment included (the eager path asks every call); callers do not modify
    the constexprs they get."""
    plans = comm.__dict__.setdefault("_fused_plans", {})
    key = (path, rows, hidden, T, comm.force_runtime_h, comm.arch, comm.max_grid,
           id(comm.built), dispatch._env_key())
    return dispatch._cached(plans, key,
                            lambda: _plan(comm, path, rows, hidden, T))


def _plan(comm: Any, path: str, rows: int, hidden: int, T: Any
          ) -> tuple[RowKernel, str, dict, int]:
    rk = comm._row_kernel(path.replace("fused_", "fused_ar_rms_"), hidden)
    cx = {"T": T, **rk.constexprs, "W": comm.world, "FP8": comm.fp8_format}
    name, per_block = rk.name, 1
    if path == "fused_2stage":
        cx.update(dispatch.fused_2stage_kernel(comm.arch, comm.world, rk.size, rk.runtime_h,
                                              rows, rk.block or NORM_BLOCK))
    elif not rk.runtime_h:
        v = dispatch.fused_1stage_rows(comm.arch, comm.world, rows, hidden, comm.max_grid)
        if v > 1 and comm.built.has(ROWS_OP, H=hidden, W=comm.world, V=v):
            name, per_block, cx["V"] = ROWS_OP, v, v
    grid = max(1, min(-(-rows // per_block), comm.max_grid, layout.MAX_BLOCKS))
    return rk, name, cx, grid


def gather_launch(comm: Any, gk: RowKernel, T: Any, fused_args: dict
                  ) -> tuple[str, dict, dict]:
    """(kernel, constexprs, arguments) of ops/fused_ar_rms_gather.py (`gk`, its RowKernel),
    the stage 2 after a fused_ar_rms_2stage launch with S = 1 (`fused_args`: that one's)."""
    cx = {"T": T, **gk.constexprs, "W": comm.world, "FP8": comm.fp8_format}
    names = ("staging", "residual", "weight", "out", "residual_out", "q", "scale", "sig",
             "rank", "rows", "eps", "flags")
    return gk.name, cx, {**{k: fused_args[k] for k in names}, **gk.args}


def fused_ll(comm: Any, hidden: int) -> bool:
    """Whether the ll+rmsnorm path runs as one launch (ops/fused_ar_rms_ll.py, the bytes of
    the LL all-reduce then add_rmsnorm): where the build has it for H and the world, and
    runtime-H kernels are not forced (it is specialized only)."""
    return not comm.force_runtime_h and comm.built.has(FUSED_LL_OP, H=hidden, W=comm.world)


def fused_ll_launch(comm: Any, rows: int, hidden: int, T: Any) -> tuple[dict, int]:
    """(constexprs, grid) of that launch: a block per row, at most the resident grid."""
    rk = comm._row_kernel(FUSED_LL_OP, hidden)
    cx = {"T": T, **rk.constexprs, "W": comm.world, "FP8": comm.fp8_format}
    return cx, max(1, min(rows, comm.max_grid, layout.MAX_BLOCKS))
