"""Load manifest HSACO code objects and launch them with hip-python, no MLIR.

Arguments go as one buffer (HIP_LAUNCH_PARAM_BUFFER_POINTER/SIZE, END = 3 on HIP): the
exact bytes the entry's PackPlan (packplan.py) built at the offsets the code object's metadata
declares. The runtime appends the hidden arguments itself. We build the `extra` array with
ctypes and pass its address, rather than hip-python's list form, whose own packing
guesses alignment instead of using the code object's offsets.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from ..kernarg import LaunchBuffer, dim3
from ..loader_base import ManifestLoader
from ..manifest import KernelEntry, Manifest
from ._api import check, hip

__all__ = ["HipKernel", "HipLoader", "set_device", "stream_handle", "clear_caches"]

_LOCK = threading.RLock()
_MODULES: dict[tuple[int, str], Any] = {}  # (device, code object sha256) -> hipModule_t


def clear_caches() -> None:
    with _LOCK:
        _MODULES.clear()


def set_device(device: int) -> None:
    """Make `device` current on this thread (HIP keeps one per thread, like torch)."""
    h = hip()
    cur = check(h.hipGetDevice(), "hipGetDevice")
    if int(cur) != device:
        check(h.hipSetDevice(device), f"hipSetDevice({device})")


def default_device() -> int:
    try:
        import torch
        if torch.cuda.is_available():  # ROCm torch keeps the cuda namespace
            return int(torch.cuda.current_device())
    except ImportError:
        pass
    return 0


def stream_handle(stream: Any, device: int) -> int:
    """A raw hipStream_t value: None -> torch's current stream (0 without torch)."""
    if stream is None:
        try:
            import torch
            if torch.cuda.is_available():
                return int(torch.cuda.current_stream(device).cuda_stream)
        except ImportError:
            pass
        return 0
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    return int(stream)


class HipKernel:
    def __init__(self, entry: KernelEntry, device: int, function: Any):
        self.entry = entry
        self.device = device
        self.function = function

    def __repr__(self) -> str:
        return f"HipKernel({self.entry.name!r}, device={self.device})"

    def launch(self, grid: int | tuple[int, ...], args: Mapping[str, Any] | bytes, *,
               stream: Any = None, shared_bytes: int | None = None,
               trusted: bool = False) -> None:
        """Launch `grid` blocks of the manifest's block_size on `stream` (torch's current
        stream by default); `args` name -> value, or packed bytes. `trusted=True` skips the
        per-argument checks, for callers that made them (the communicators)."""
        e, h = self.entry, hip()
        if isinstance(args, (bytes, bytearray)):
            data = bytes(args)
        else:
            data = e.pack_trusted(args) if trusted else e.pack(args, device=self.device)
        if len(data) != e.kernarg_size:
            raise ValueError(f"kernel {e.name}: {len(data)} kernarg bytes, expected "
                             f"{e.kernarg_size}")
        g = dim3(grid, "grid")
        smem = e.dynamic_lds_bytes if shared_bytes is None else int(shared_bytes)
        set_device(self.device)
        s = stream_handle(stream, self.device)
        buf = LaunchBuffer(data)
        extra = buf.extra(int(h.HIP_LAUNCH_PARAM_BUFFER_POINTER),
                          int(h.HIP_LAUNCH_PARAM_BUFFER_SIZE), int(h.HIP_LAUNCH_PARAM_END))
        check(h.hipModuleLaunchKernel(self.function, g[0], g[1], g[2], e.block_size, 1, 1,
                                      smem, s, None, extra),
              f"hipModuleLaunchKernel({e.name}, grid={g}, block={e.block_size}, smem={smem})")

    def launch_trusted(self, grid: int | tuple[int, ...], args: Mapping[str, Any],
                       stream: Any = None) -> None:
        """`launch(grid, args, trusted=True)`: the interface the communicators launch
        through (the CUDA loader's fast path has the same signature)."""
        self.launch(grid, args, stream=stream, trusted=True)


class HipLoader(ManifestLoader):
    """Kernels of one AMD manifest (gfx1250/gfx950/gfx942) on one device."""

    vendor, vendor_name = "amd", "AMD"

    def __init__(self, manifest: Manifest | str | os.PathLike, arch: str | None = None, *,
                 device: int | None = None):
        super().__init__(manifest, arch, default_device() if device is None else int(device))

    def _load(self, entry: KernelEntry) -> HipKernel:
        h = hip()
        set_device(self.device)
        with _LOCK:
            key = (self.device, entry.sha256)
            module = _MODULES.get(key)
            if module is None:
                module = check(h.hipModuleLoadData(entry.code_object()),
                               f"hipModuleLoadData({entry.path.name})")
                _MODULES[key] = module
            func = check(h.hipModuleGetFunction(module, entry.symbol.encode()),
                         f"hipModuleGetFunction({entry.symbol!r} in {entry.path.name})")
        return HipKernel(entry, self.device, func)
