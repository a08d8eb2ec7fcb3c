"""The collective and local methods of a Communicator, the same on every backend.

A backend (sim, cuda, hip) subclasses `Collectives` and provides the primitives listed in
`Backend primitives` below; everything here is device-independent: input checks, dispatch,
argument tables and output shapes. Inputs are checked before any kernel runs or the
registered pool is written. Empty inputs (no rows, no elements) return empty results without
a launch: sizes are equal on every rank by contract, so every rank skips the same call.
"""
from __future__ import annotations

import functools
import os
from typing import Any

import torch

from .. import layout
from ..ops._rows import FLAG_FP8, FLAG_GEMMA, FLAG_MIRROR, SUPPORTED_HIDDEN, hidden_rule_error
from . import dispatch
from .built import FUSED_LL_OP, Built, RowKernel, from_registry
from .callid import CallIdentity, collective_call, local_call
from .fused_launch import fused_kernel, fused_ll, fused_ll_launch, gather_launch
from .norm_result import NormResult  # noqa: F401 (the norm entry points' result type)

DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16"}
FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
ALIGN = 16


def check_tensor(name: str, t: Any, dtype: torch.dtype | None = None,
                 shape: tuple | None = None, contiguous: bool = True) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} has dtype {t.dtype}; expected {dtype}")
    if dtype is None and t.dtype not in DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: bfloat16, float16")
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {t.stride()}); pass a contiguous "
                         "tensor")
    if t.is_cuda and t.data_ptr() % ALIGN:
        raise ValueError(f"{name} starts at address {t.data_ptr():#x}, not {ALIGN}-byte aligned")


def check_hidden(hidden: int, built: Built | None = None,
                 entry: str = "add_rmsnorm") -> None:
    """A hidden size that is not a multiple of 8 in [256, 16384], or that no built kernel
    serves, is an error naming the rule or the built sizes (from `built`, else the op
    registry's: the specialized sizes, SUPPORTED_HIDDEN, and the runtime-H bounds)."""
    if built is not None:
        built.check_hidden(hidden, entry)
    else:
        why = hidden_rule_error(hidden, entry)
        if why is not None:
            raise ValueError(f"{why}; specialized sizes: {SUPPORTED_HIDDEN}")


def _empty(x: torch.Tensor, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=x.device)


class Collectives(CallIdentity):
    """Backend primitives a subclass provides:
        rank, world, arch, fp8_format, max_grid
        meta_layout: layout.MetaLayout    what each rank's meta buffer holds
        meta_bases: list[int]             every rank's meta buffer address
        pool_bytes: int | None            the registered input pool (None: grows on demand)
        _dev(t)                   t on the device (copied in where needed)
        _addr(buf) -> int         the device address of a buffer from _dev/_new
        _new(shape, dtype) -> int a fresh device buffer
        _get(addr, shape, dtype) -> torch.Tensor  the result as a tensor of the caller
        _stage(t) -> int          t where every rank can read it: the device address of a
                                  table of every rank's address of it (RegisteredPtrs)
        _launch(name, constexprs, grid, args)     a kernel launch (collective ones on all ranks)
        _fallback_all_reduce(t) -> torch.Tensor   the library all-reduce (torch.distributed)
        _write_signal(word, values)               i32 words into this rank's Signal (test hook)
    Every collective launch's `args["call"]` is `self._call_id_for(...)` (callid.py); every
    public entry point is a `collective_call` or `local_call`: after an error, or close(),
    each call is refused before it launches or writes anything.
    """

    last_path: str = ""  # the path of the last call ("empty": returned without a launch)
    pool_bytes: int | None = None

    @functools.cached_property
    def built(self) -> Built:
        """The world and hidden sizes there are kernels for. The GPU Communicator sets it
        from its manifest; the simulator's are the op registry's variants for the target."""
        return from_registry(self.arch)

    @functools.cached_property
    def _hidden_built(self) -> set[tuple[int, str]]:
        """(hidden, entry) pairs `check_hidden` passed: `built` never changes."""
        return set()

    @functools.cached_property
    def force_runtime_h(self) -> bool:
        """Launch the row kernels' runtime-H variants even where a specialized one is built
        (benchmarks and tests compare the two): PEERDSL_FORCE_RUNTIME_H=1, read once per
        communicator, or set this attribute."""
        return os.environ.get("PEERDSL_FORCE_RUNTIME_H", "0") not in ("", "0")

    def _row_kernel(self, op: str, hidden: int) -> RowKernel:
        """The variant of row op `op` for `hidden` (built.py Built.row_kernel)."""
        return self.built.row_kernel(op, hidden, self.force_runtime_h)

    # ------------------------------------------------------------------ the meta buffer
    # (fixed once the communicator is set up: computed on first use, not on every call)
    @functools.cached_property
    def signal_peers(self) -> list[int]:
        return [b + self.meta_layout.signal_offset for b in self.meta_bases]

    @functools.cached_property
    def ll_peers(self) -> list[int]:
        return [b + self.meta_layout.ll_offset for b in self.meta_bases]

    @functools.cached_property
    def staging_peers(self) -> list[int]:
        return [b + self.meta_layout.staging_offset for b in self.meta_bases]

    @functools.cached_property
    def ll_lines_per_peer(self) -> int:
        return layout.ll_packets(self.meta_layout.ll_max_bytes)

    @functools.cached_property
    def capacity(self) -> dict[str, int]:
        """What this communicator allocated: dispatch never plans past it."""
        cap = {"ll_max_bytes": self.meta_layout.ll_max_bytes,
               "staging_bytes": self.meta_layout.staging_bytes}
        if self.pool_bytes is not None:
            cap["custom_ar_max_bytes"] = self.pool_bytes
        return cap

    # ------------------------------------------------------------------ plain collectives
    @collective_call
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        check_tensor("x", x, contiguous=False)
        if x.numel() == 0:  # torch.distributed's all-reduce of nothing: nothing
            self.last_path = "empty"
            return _empty(x, tuple(x.shape), x.dtype)
        T = DTYPES[x.dtype]
        nbytes = x.numel() * x.element_size()
        path = dispatch.plan_all_reduce(self.arch, self.world, nbytes, x.is_contiguous(),
                                        self.capacity)
        self.last_path = path
        if path == "local":
            return x.clone()
        if path == "fallback":
            return self._fallback_all_reduce(x)
        packs = nbytes // 16
        out = self._new(tuple(x.shape), x.dtype)
        if path == "ll":
            if 2 * packs > self.ll_lines_per_peer:  # dispatch's capacity cap makes this dead
                raise AssertionError(f"LL launch of {nbytes} bytes past the scratch")
            grid = self._grid(packs)
            self._launch("allreduce_ll", {"T": T, "W": self.world}, grid, {
                "x": self._dev(x), "out": out, "sig": self.signal_peers, "ll": self.ll_peers,
                "rank": self.rank, "n_packs": packs, "lines_per_peer": self.ll_lines_per_peer})
        elif path == "1stage":
            cx, per_block = dispatch.ar_kernel(self.arch, path, self.world, packs, self.max_grid)
            self._launch("allreduce_1stage", {"T": T, "W": self.world, **cx},
                         self._grid(packs, per_block), {
                             "inp": self._stage(x), "out": out, "sig": self.signal_peers,
                             "rank": self.rank, "n_packs": packs})
        else:
            shard = packs // self.world
            cx, per_block = dispatch.ar_kernel(self.arch, path, self.world, shard, self.max_grid)
            self._launch("allreduce_2stage", {"T": T, "W": self.world, **cx},
                         self._grid(shard, per_block), {
                             "inp": self._stage(x), "staging": self.staging_peers, "out": out,
                             "sig": self.signal_peers, "rank": self.rank, "shard_packs": shard})
        return self._get(out, tuple(x.shape), x.dtype)

    @collective_call
    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        nbytes = x.numel() * x.element_size()
        if nbytes % 16:
            raise ValueError(f"all_gather needs a multiple of 16 bytes, got {nbytes}")
        cap = dispatch.thresholds(self.arch, self.capacity).custom_ar_max_bytes
        if nbytes > cap // self.world:
            raise ValueError(f"all_gather of {nbytes} bytes per rank exceeds the pool "
                             f"({cap} bytes / world {self.world})")
        shape = (self.world,) + tuple(x.shape)
        if nbytes == 0:
            self.last_path = "empty"
            return _empty(x, shape, x.dtype)
        x = x.contiguous()
        self.last_path = "allgather"
        if self.world == 1:
            return x.clone().reshape(shape)
        packs = nbytes // 16
        out = self._new(shape, x.dtype)
        # the kernel moves i32x4 packs of any dtype: pass the address, not the typed tensor
        self._launch("allgather", {"W": self.world}, self._grid(packs), {
            "inp": self._stage(x), "out": int(self._addr(out)), "sig": self.signal_peers, "rank": self.rank,
            "n_packs": packs})
        return self._get(out, shape, x.dtype)

    @collective_call
    def null_collective(self) -> None:
        """A launch and one Signal barrier on every rank (the small-row latency floor)."""
        self.last_path = "null"
        self._launch("null_collective", {"W": self.world}, 1,
                     {"sig": self.signal_peers, "rank": self.rank})

    # ------------------------------------------------------------------ local kernels
    def _norm_checks(self, x, residual, weight, entry: str = "add_rmsnorm"):
        check_tensor("x", x, contiguous=False)
        if x.dim() != 2:
            raise ValueError(f"x must be [rows, hidden], got shape {tuple(x.shape)}")
        rows, hidden = x.shape
        if (hidden, entry) not in self._hidden_built:  # checked once per size: it builds sets
            check_hidden(hidden, self.built, entry)
            self._hidden_built.add((hidden, entry))
        check_tensor("residual", residual, x.dtype, (rows, hidden))
        check_tensor("weight", weight, x.dtype, (hidden,))
        for name, t in (("residual", residual), ("weight", weight)):
            if t.device != x.device:  # x's own device is checked before its first use
                raise ValueError(f"{name} is on {t.device} but x is on {x.device}; pass "
                                 "all three on the communicator's device")
        return rows, hidden, DTYPES[x.dtype]

    def _empty_norm_result(self, x, hidden, flags) -> NormResult:
        """add + RMSNorm of no rows: empty outputs of the shapes and dtypes of the full ones."""
        e = lambda dtype, cols=hidden: _empty(x, (0, cols), dtype)  # noqa: E731
        if flags & FLAG_FP8:
            res = NormResult(None, e(x.dtype), e(FP8_DTYPES[self.fp8_format]),
                             e(torch.float32, 1), e(x.dtype) if flags & FLAG_MIRROR else None)
        else:
            res = NormResult(e(x.dtype), e(x.dtype))
        self.last_path = "empty"
        return res

    def _flags(self, gemma_norm: bool, fp8_out: bool, mirror: bool) -> int:
        if mirror and not fp8_out:
            raise ValueError("bf16_mirror=True needs fp8_out=True (the mirror is the T copy "
                             "of an FP8 output)")
        return (FLAG_GEMMA * bool(gemma_norm) | FLAG_FP8 * bool(fp8_out)
                | FLAG_MIRROR * bool(mirror))

    def _norm_outputs(self, rows, hidden, dtype, flags):
        out = self._new((rows, hidden), dtype)
        res_out = self._new((rows, hidden), dtype)
        q = self._new((rows, hidden), torch.int8) if flags & FLAG_FP8 else 0
        scale = self._new((rows, 1), torch.float32) if flags & FLAG_FP8 else 0
        return {"out": out, "residual_out": res_out, "q": q, "scale": scale}

    def _norm_result(self, bufs, rows, hidden, dtype, flags) -> NormResult:
        shape = (rows, hidden)
        residual_out = self._get(bufs["residual_out"], shape, dtype)
        if not flags & FLAG_FP8:
            return NormResult(self._get(bufs["out"], shape, dtype), residual_out)
        q = self._get(bufs["q"], shape, torch.int8).view(FP8_DTYPES[self.fp8_format])
        scale = self._get(bufs["scale"], (rows, 1), torch.float32)
        mirror = self._get(bufs["out"], shape, dtype) if flags & FLAG_MIRROR else None
        return NormResult(None, residual_out, q, scale, mirror)

    @local_call
    def add_rmsnorm(self, x, residual, weight, eps: float = 1e-6, gemma_norm: bool = False,
                    fp8_out: bool = False, bf16_mirror: bool = False) -> NormResult:
        rows, hidden, T = self._norm_checks(x, residual, weight)
        flags = self._flags(gemma_norm, fp8_out, bf16_mirror)
        eps = float(eps)
        if rows == 0:
            return self._empty_norm_result(x, hidden, flags)
        return self._add_rmsnorm(x, residual, weight, eps, flags, rows, hidden, T)

    def _add_rmsnorm(self, x, residual, weight, eps, flags, rows, hidden, T) -> NormResult:
        """add + RMSNorm of inputs checked already (by add_rmsnorm or the fused entry)."""
        bufs = self._norm_outputs(rows, hidden, x.dtype, flags)
        rk = self._row_kernel("add_rmsnorm", hidden)
        self._launch(rk.name, {"T": T, **rk.constexprs, "FP8": self.fp8_format},
                     self._local_grid(rows), dict(
                         x=self._dev(x.contiguous()), residual=self._dev(residual),
                         weight=self._dev(weight), rows=rows, eps=float(eps), flags=flags,
                         **bufs, **rk.args), local=True)
        return self._norm_result(bufs, rows, hidden, x.dtype, flags)

    @local_call
    def per_token_quant_fp8(self, x: torch.Tensor):
        check_tensor("x", x)
        if x.dim() != 2:
            raise ValueError(f"x must be [rows, hidden], got shape {tuple(x.shape)}")
        rows, hidden = x.shape
        check_hidden(hidden, self.built, "per_token_quant_fp8")
        if rows == 0:
            self.last_path = "empty"
            return (_empty(x, (0, hidden), FP8_DTYPES[self.fp8_format]),
                    _empty(x, (0, 1), torch.float32))
        q = self._new((rows, hidden), torch.int8)
        scale = self._new((rows, 1), torch.float32)
        rk = self._row_kernel("per_token_quant_fp8", hidden)
        self._launch(rk.name, {"T": DTYPES[x.dtype], **rk.constexprs, "FP8": self.fp8_format},
                     self._local_grid(rows),
                     {"x": self._dev(x), "q": q, "scale": scale, "rows": rows, **rk.args},
                     local=True)
        return (self._get(q, (rows, hidden), torch.int8).view(FP8_DTYPES[self.fp8_format]),
                self._get(scale, (rows, 1), torch.float32))

    # ------------------------------------------------------------------ fused
    @collective_call
    def fused_allreduce_rmsnorm(self, x, residual, weight, eps: float = 1e-6,
                                gemma_norm: bool = False, fp8_out: bool = False,
                                bf16_mirror: bool = False) -> NormResult:
        rows, hidden, T = self._norm_checks(x, residual, weight, "fused_allreduce_rmsnorm")
        flags = self._flags(gemma_norm, fp8_out, bf16_mirror)
        eps = float(eps)
        if rows == 0:  # every rank: the rows are the same on every rank by contract
            return self._empty_norm_result(x, hidden, flags)
        path = dispatch.plan_fused_ar_rms(self.arch, self.world, rows, hidden, x.dtype,
                                          fp8_out, x.is_contiguous(), capacity=self.capacity)
        if path == "local":
            result = self._add_rmsnorm(x, residual, weight, eps, flags, rows, hidden, T)
        elif path == "ll+rmsnorm" and fused_ll(self, hidden):  # one launch, same bytes
            bufs = self._norm_outputs(rows, hidden, x.dtype, flags)
            cx, grid = fused_ll_launch(self, rows, hidden, T)
            self._launch(FUSED_LL_OP, cx, grid, dict(
                x=self._dev(x), residual=self._dev(residual), weight=self._dev(weight),
                sig=self.signal_peers, ll=self.ll_peers, rank=self.rank, rows=rows,
                lines_per_peer=self.ll_lines_per_peer, eps=eps, flags=flags, **bufs))
            result = self._norm_result(bufs, rows, hidden, x.dtype, flags)
        elif path in ("unfused", "fallback", "ll+rmsnorm"):
            xc = x.contiguous()
            ar = self._fallback_all_reduce(xc) if path == "fallback" else self.all_reduce(xc)
            result = self._add_rmsnorm(ar, residual, weight, eps, flags, rows, hidden, T)
        else:
            result = self._fused(path, x, residual, weight, eps, flags, rows, hidden, T)
        self.last_path = path
        return result

    def _fused(self, path, x, residual, weight, eps, flags, rows, hidden, T) -> NormResult:
        fp8_out, bf16_mirror = bool(flags & FLAG_FP8), bool(flags & FLAG_MIRROR)
        quant_after = fp8_out and not dispatch.fp8_in_epilogue(self.arch, rows, hidden, x.dtype)
        kflags = flags & ~(FLAG_FP8 | FLAG_MIRROR) if quant_after else flags
        bufs = self._norm_outputs(rows, hidden, x.dtype, kflags)
        # residual and weight first: _dev may raise, and _stage writes the registered pool
        residual_dev, weight_dev = self._dev(residual), self._dev(weight)
        # chosen before _stage writes the registered pool (it raises when nothing is built)
        rk, name, constexprs, grid = fused_kernel(self, path, rows, hidden, T)
        # S = 1: stage 1 alone, then the gather launch; its variant too before any launch
        gather_kernel = (self._row_kernel("fused_ar_rms_gather", hidden)
                         if constexprs.get("S") else None)
        args = dict(inp=self._stage(x), residual=residual_dev, weight=weight_dev,
                    sig=self.signal_peers, rank=self.rank, rows=rows, eps=eps,
                    flags=kflags, **bufs, **rk.args)
        if path == "fused_2stage":
            args["staging"] = self.staging_peers
        self._launch(name, constexprs, grid, args)
        if gather_kernel is not None:
            name, cx, gather_args = gather_launch(self, gather_kernel, T, args)
            self._launch(name, cx, self._local_grid(rows), gather_args, local=True)
        result = self._norm_result(bufs, rows, hidden, x.dtype, kflags)
        if quant_after:
            q, scale = self.per_token_quant_fp8(result.out)
            result = NormResult(None, result.residual_out, q, scale,
                                result.out if bf16_mirror else None)
        return result

    # ------------------------------------------------------------------ prepared calls
    def prepare_fused_allreduce_rmsnorm(self, x, residual, weight, *args: Any,
                                        out: torch.Tensor | None = None,
                                        residual_out: torch.Tensor | None = None,
                                        stage_input: bool = False, **kwargs: Any) -> Any:
        """`fused_allreduce_rmsnorm(x, residual, weight, *args, **kwargs)` prepared once to
        be made many times: checked, planned, outputs allocated (or `out=`,
        `residual_out=`) and arguments packed now; each `prep()` call then reads the bound
        tensors and returns the same NormResult (see runtime/prepared.py). Collective."""
        from .prepared_fused import prepare_fused
        return prepare_fused(self, x, residual, weight, args, kwargs, out, residual_out,
                             stage_input)

    def prepare_all_reduce(self, x: torch.Tensor, *, out: torch.Tensor | None = None,
                           stage_input: bool = False) -> Any:
        """`all_reduce(x)` prepared once to be made many times (runtime/prepared.py); each
        `prep()` call reduces x as it is then into the same output tensor. Collective."""
        from .prepared import prepare_all_reduce
        return prepare_all_reduce(self, x, out, stage_input)

    # ------------------------------------------------------------------ helpers
    max_local_grid = 65535  # local kernels need no co-residency: one block per row

    def _local_grid(self, rows: int) -> int:
        return max(1, min(rows, self.max_local_grid))

    def _grid(self, work_items: int, per_block: int = 256) -> int:
        """Blocks for `work_items` items, `per_block` per block per iteration (a collective
        kernel's threads times its unroll), capped so every rank's blocks are resident."""
        return max(1, min((work_items + per_block - 1) // per_block, self.max_grid,
                          layout.MAX_BLOCKS))

    def fused_qk_norm_allreduce(self, *args, **kwargs):
        dispatch.check_qk_norm(self.arch)
