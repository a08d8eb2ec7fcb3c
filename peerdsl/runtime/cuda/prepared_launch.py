"""One kernel launch prepared once and made many times (the GPU side of issue 15's prepared
calls, runtime/prepared.py).

`CudaKernel.prepare(grid, args)` packs the kernarg bytes once into host memory it keeps for
its life (`kernarg.LaunchBuffer`, with the driver's argument arrays already pointing into
it) and resolves everything a launch needs: the function, grid, block, shared memory and the
argument form (kernelParams or CU_LAUNCH_PARAM_BUFFER_POINTER). `launcher(words)` returns a
closure that writes the named 4-byte arguments in place (the call tag changes every call)
and makes ONE driver call, cuLaunchKernel, on torch's current stream: no packing, no
allocation, no per-call check. The driver copies the arguments during the call, so the same
bytes may be patched again for the next launch right after it.

The primary context is not looked up before each launch (that is a driver call of its own):
a launch made while another context is current fails without launching anything, and is
then made once more with this device's primary context current.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..kernarg import LaunchBuffer, dim3
from ._driver import check, driver

__all__ = ["PreparedLaunch"]


class PreparedLaunch:
    """A kernel's launch with its arguments packed once (see the module docstring).
    `stream`: a fixed stream for every launch; None: torch's current stream at each one."""

    def __init__(self, kernel: Any, grid: int | tuple[int, ...], args: Mapping[str, Any],
                 stream: Any = None):
        from .loader import _RAW_STREAM, current_stream, ensure_context, stream_handle
        e = self.entry = kernel.entry
        self.kernel = kernel
        self.plan = e.pack_plan()
        self.buffer = LaunchBuffer(self.plan.pack(args))  # trusted: the caller checked args
        drv = driver()
        if kernel.mode == "params":
            self._params = self.buffer.params([a.offset for a in e.args]) if e.args else None
            self._extra = 0
        elif kernel.mode == "buffer":
            self._params = None
            self._extra = self.buffer.extra(int(getattr(drv, "CU_LAUNCH_PARAM_BUFFER_POINTER", 1)),
                                            int(getattr(drv, "CU_LAUNCH_PARAM_BUFFER_SIZE", 2)),
                                            int(getattr(drv, "CU_LAUNCH_PARAM_END", 0)))
        else:
            raise ValueError(f"launch mode must be 'params' or 'buffer', got {kernel.mode!r}")
        self.grid = dim3(grid, "grid")
        smem = e.dynamic_lds_bytes
        ensure_context(kernel.device)
        if smem > kernel._smem_opt_in:
            kernel._opt_in_smem(smem)
        self.device = kernel.device
        if stream is None:
            current_stream(self.device)  # picks torch's raw-stream lookup once
            self._stream: Callable[[int], int] | None = _RAW_STREAM[0]
            self._fixed_stream = 0
        else:
            self._stream, self._fixed_stream = None, stream_handle(stream, self.device)
        self._words: dict[str, ctypes.c_int32] = {}

    def __repr__(self) -> str:
        return f"PreparedLaunch({self.entry.name!r}, grid={self.grid})"

    @property
    def data(self) -> bytes:
        """The kernarg bytes as the next launch sends them."""
        return ctypes.string_at(self.buffer.address, self.plan.size)

    def word(self, name: str) -> ctypes.c_int32:
        """A writable view of the 4-byte argument `name` inside the launch's bytes."""
        hit = self._words.get(name)
        if hit is None:
            spec = {a.name: a for a in self.entry.args}.get(name)
            if spec is None or spec.size != 4 or spec.type.is_pointer:
                raise KeyError(f"kernel {self.entry.name} has no 4-byte scalar argument "
                               f"{name!r} (arguments: {self.entry.arg_names})")
            hit = self._words[name] = ctypes.c_int32.from_address(self.buffer.address
                                                                  + spec.offset)
        return hit

    def launcher(self, words: Sequence[str] = ()) -> Callable[..., None]:
        """The launch as a closure: `go()` for no `words`, else `go(value)`, which first
        writes `value` (a 31-bit tag, an i32) into each named argument."""
        drv = driver()
        go = drv.cuLaunchKernel
        f, (gx, gy, gz), bx = self.kernel.function, self.grid, self.entry.block_size
        smem, params, extra = self.entry.dynamic_lds_bytes, self._params, self._extra
        raw, fixed, dev = self._stream, self._fixed_stream, self.device
        failed = self._failed
        # cuda-bindings returns its CUresult members: success is one object, so `is not`
        # decides (an int 0 from another driver object only takes the slow path's re-check)
        ok = getattr(getattr(drv, "CUresult", None), "CUDA_SUCCESS", 0)
        views = [self.word(n) for n in words]

        if raw is None:
            def launch() -> None:
                res = go(f, gx, gy, gz, bx, 1, 1, smem, fixed, params, extra)
                if res[0] is not ok:
                    failed(res, fixed)
        else:
            def launch() -> None:
                h = raw(dev)
                res = go(f, gx, gy, gz, bx, 1, 1, smem, h, params, extra)
                if res[0] is not ok:
                    failed(res, h)
        if not views:
            return launch
        if len(views) == 1:
            view = views[0]
            if raw is None:
                def tagged(value: int) -> None:
                    view.value = value
                    res = go(f, gx, gy, gz, bx, 1, 1, smem, fixed, params, extra)
                    if res[0] is not ok:
                        failed(res, fixed)
            else:
                def tagged(value: int) -> None:
                    view.value = value
                    h = raw(dev)
                    res = go(f, gx, gy, gz, bx, 1, 1, smem, h, params, extra)
                    if res[0] is not ok:
                        failed(res, h)
            return tagged

        def tagged_many(value: int) -> None:
            for v in views:
                v.value = value
            launch()
        return tagged_many

    def _failed(self, res: Any, stream: int) -> None:
        """A launch returned an error. When this device's primary context was not current
        (nothing was launched), make it current and launch once more; else raise."""
        from .loader import ensure_context
        drv, e = driver(), self.entry
        if not int(res[0]):
            return
        cur = drv.cuCtxGetCurrent()
        ctx = ensure_context(self.device)
        if int(cur[0]) or cur[1] is None or int(cur[1]) != int(ctx):
            (gx, gy, gz), smem = self.grid, e.dynamic_lds_bytes
            res = drv.cuLaunchKernel(self.kernel.function, gx, gy, gz, e.block_size, 1, 1,
                                     smem, stream, self._params, self._extra)
            if not int(res[0]):
                return
        check(res, f"cuLaunchKernel({e.name}, grid={self.grid}, block={e.block_size}, "
                   f"smem={e.dynamic_lds_bytes}) of a prepared call")
