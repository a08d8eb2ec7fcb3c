"""Load manifest cubins and launch them with the CUDA driver API (cuda-bindings), no MLIR.

Context: torch (the runtime API) runs on each device's *primary* context. We retain that
same primary context (cuDevicePrimaryCtxRetain) and make it current before every driver
call, so modules, pointers and streams are shared with torch even on threads where torch
never set a context.

Argument passing: cuda-bindings 13 takes `kernelParams` and `extra` as raw addresses
(`extra` is a `void_ptr`), so both forms work from Python if we build the arrays with
ctypes (`kernarg.LaunchBuffer`). Default is "params": a void*[n] array pointing into the
packed kernarg bytes at the manifest's offsets; the driver then copies each parameter with
the size the cubin itself records, so no rule about the total buffer size can bite. Mode
"buffer" passes the same bytes whole (CU_LAUNCH_PARAM_BUFFER_POINTER/SIZE), as HIP does.
At load we compare the manifest's offsets/sizes with the cubin's (cuFuncGetParamInfo),
so a layout mismatch fails loudly in either mode instead of launching with garbage.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Mapping

from ..kernarg import LaunchBuffer, dim3
from ..loader_base import ManifestLoader
from ..manifest import KernelEntry, Manifest
from ._driver import check, driver

__all__ = ["CudaKernel", "CudaLoader", "ensure_context", "default_device", "stream_handle",
           "clear_caches"]

_LOCK = threading.RLock()
_PRIMARY: dict[int, Any] = {}              # device ordinal -> retained primary CUcontext
_MODULES: dict[tuple[int, str], Any] = {}  # (device, code object sha256) -> CUmodule
_DEFAULT_SMEM_LIMIT = 48 * 1024            # above this a kernel must opt in


def clear_caches() -> None:
    """Forget cached contexts/modules (tests; after a fork, handles are not valid)."""
    with _LOCK:
        _PRIMARY.clear()
        _MODULES.clear()


def default_device() -> int:
    """torch's current CUDA device when torch has CUDA, else 0."""
    try:
        import torch
        if torch.cuda.is_available():
            return int(torch.cuda.current_device())
    except ImportError:
        pass
    return 0


def ensure_context(device: int) -> Any:
    """Make `device`'s primary context (the one torch uses) current on this thread."""
    drv = driver()
    with _LOCK:
        ctx = _PRIMARY.get(device)
        if ctx is None:
            check(drv.cuInit(0), "cuInit")
            dev = check(drv.cuDeviceGet(device), f"cuDeviceGet({device})")
            ctx = check(drv.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain({device})")
            _PRIMARY[device] = ctx
    cur = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if cur is None or int(cur) != int(ctx):
        check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def stream_handle(stream: Any, device: int) -> int:
    """A raw CUstream value: None -> torch's current stream on `device` (0 without torch)."""
    if stream is None:
        try:
            import torch
            if torch.cuda.is_available():
                return int(torch.cuda.current_stream(device).cuda_stream)
        except ImportError:
            pass
        return 0
    if hasattr(stream, "cuda_stream"):   # torch.cuda.Stream / ExternalStream
        return int(stream.cuda_stream)
    if hasattr(stream, "handle") and not isinstance(stream, int):  # cuda.core Stream
        return int(stream.handle)
    return int(stream)                   # int or CUstream


def _get_attr(drv: Any, func: Any, name: str) -> int | None:
    attr = getattr(getattr(drv, "CUfunction_attribute", None), name, None)
    if attr is None:
        return None
    res = drv.cuFuncGetAttribute(attr, func)
    return int(res[1]) if int(res[0]) == 0 else None


def _param_layout(drv: Any, func: Any, limit: int) -> list[tuple[int, int]] | None:
    """[(offset, size)] per parameter as the cubin records it; None if the driver can't say."""
    fn = getattr(drv, "cuFuncGetParamInfo", None)  # CUDA >= 12.4
    if fn is None:
        return None
    out: list[tuple[int, int]] = []
    for i in range(limit + 1):  # one past the expected count, to catch extra params
        try:
            res = fn(func, i)
        except Exception:
            return None
        if int(res[0]) != 0:
            invalid = getattr(getattr(drv, "CUresult", None), "CUDA_ERROR_INVALID_VALUE", 1)
            if int(res[0]) != int(invalid):
                return None  # not supported by this driver: skip the check
            break
        out.append((int(res[1]), int(res[2])))
    return out


class CudaKernel:
    """One loaded kernel: `launch(grid, args)` packs and launches on a torch stream."""

    def __init__(self, entry: KernelEntry, device: int, function: Any, mode: str = "params"):
        self.entry = entry
        self.device = device
        self.function = function
        self.mode = mode
        self.attributes: dict[str, int] = {}
        self._smem_opt_in = _DEFAULT_SMEM_LIMIT

    def __repr__(self) -> str:
        return f"CudaKernel({self.entry.name!r}, device={self.device})"

    def _inspect(self) -> None:
        """Check the cubin against the manifest: parameter layout and block size."""
        drv, e = driver(), self.entry
        for key, attr in (("max_threads_per_block", "CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK"),
                          ("num_regs", "CU_FUNC_ATTRIBUTE_NUM_REGS"),
                          ("static_smem_bytes", "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES"),
                          ("local_bytes", "CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES")):
            v = _get_attr(drv, self.function, attr)
            if v is not None:
                self.attributes[key] = v
        mt = self.attributes.get("max_threads_per_block")
        if mt is not None and e.block_size > mt:
            raise RuntimeError(f"kernel {e.name}: block_size {e.block_size} exceeds the "
                               f"cubin's limit of {mt} threads per block "
                               f"({self.attributes.get('num_regs')} registers per thread)")
        layout = _param_layout(drv, self.function, len(e.args))
        if layout is not None:
            want = [(a.offset, a.size) for a in e.args]
            if layout != want:
                raise RuntimeError(f"kernel {e.name}: manifest argument layout {want} "
                                   f"(names {e.arg_names}) differs from the cubin's {layout}")
            self.attributes["param_layout_checked"] = 1
        if e.dynamic_lds_bytes > self._smem_opt_in:
            self._opt_in_smem(e.dynamic_lds_bytes)

    def _opt_in_smem(self, nbytes: int) -> None:
        drv = driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(self.function, attr, int(nbytes)),
              f"cuFuncSetAttribute({self.entry.name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes})")
        self._smem_opt_in = nbytes

    def launch(self, grid: int | tuple[int, ...], args: Mapping[str, Any] | bytes, *,
               stream: Any = None, shared_bytes: int | None = None,
               mode: str | None = None, trusted: bool = False) -> None:
        """Launch with `grid` blocks of the manifest's block_size on `stream` (torch's
        current stream by default). `args`: name -> value (see kernarg.pack_kernargs) or
        already packed bytes. Asynchronous, like any launch: faults surface at the next sync.
        `trusted=True` skips the per-tensor checks (dtype, device, alignment) for callers
        that made them already.
        """
        e, drv = self.entry, driver()
        if isinstance(args, (bytes, bytearray)):
            data = bytes(args)
        else:  # trusted: the caller checked its tensors (see KernelEntry.pack_trusted)
            data = e.pack_trusted(args) if trusted else e.pack(args, device=self.device)
        if len(data) != e.kernarg_size:
            raise ValueError(f"kernel {e.name}: {len(data)} kernarg bytes, expected "
                             f"{e.kernarg_size}")
        g = dim3(grid, "grid")
        smem = e.dynamic_lds_bytes if shared_bytes is None else int(shared_bytes)
        mode = mode or self.mode
        ensure_context(self.device)
        if smem > self._smem_opt_in:
            self._opt_in_smem(smem)
        h = stream_handle(stream, self.device)
        buf = LaunchBuffer(data)
        if mode == "buffer":
            extra = buf.extra(int(getattr(drv, "CU_LAUNCH_PARAM_BUFFER_POINTER", 1)),
                              int(getattr(drv, "CU_LAUNCH_PARAM_BUFFER_SIZE", 2)),
                              int(getattr(drv, "CU_LAUNCH_PARAM_END", 0)))
            params: Any = None
        elif mode == "params":
            params = buf.params([a.offset for a in e.args]) if e.args else None
            extra = 0
        else:
            raise ValueError(f"launch mode must be 'params' or 'buffer', got {mode!r}")
        check(drv.cuLaunchKernel(self.function, g[0], g[1], g[2], e.block_size, 1, 1, smem,
                                 h, params, extra),
              f"cuLaunchKernel({e.name}, grid={g}, block={e.block_size}, smem={smem})")


class CudaLoader(ManifestLoader):
    """Kernels of one sm_90 manifest on one device; modules cached per (device, sha256)."""

    vendor, vendor_name = "nvidia", "NVIDIA"

    def __init__(self, manifest: Manifest | str | os.PathLike, *, device: int | None = None,
                 mode: str = "params"):
        super().__init__(manifest, "sm_90", default_device() if device is None else int(device))
        self.mode = mode

    def _load(self, entry: KernelEntry) -> CudaKernel:
        drv = driver()
        ensure_context(self.device)
        with _LOCK:
            key = (self.device, entry.sha256)
            module = _MODULES.get(key)
            if module is None:
                image = entry.code_object()
                if not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
                    image += b"\0"  # PTX text must be NUL-terminated for cuModuleLoadData
                module = check(drv.cuModuleLoadData(image),
                               f"cuModuleLoadData({entry.path.name})")
                _MODULES[key] = module
            func = check(drv.cuModuleGetFunction(module, entry.symbol.encode()),
                         f"cuModuleGetFunction({entry.symbol!r} in {entry.path.name})")
        k = CudaKernel(entry, self.device, func, self.mode)
        k._inspect()
        return k
