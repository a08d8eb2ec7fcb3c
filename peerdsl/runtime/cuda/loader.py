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

Host cost: each kernel keeps, per thread, one kernarg buffer with both argument arrays
already pointing into it (the driver copies the arguments during cuLaunchKernel, so the
buffer is refilled in place for the next launch), and `launch_trusted` fills it with the
entry's compiled PackPlan and launches with no per-call allocation beyond the driver call.
`prepare` goes further for a launch made many times with the same arguments: packed once,
then one driver call per launch (prepared_launch.py; the communicators' prepared calls).
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..kernarg import LaunchBuffer, dim3
from ..loader_base import ManifestLoader
from ..manifest import KernelEntry, Manifest
from ._driver import check, driver

if TYPE_CHECKING:
    from .prepared_launch import PreparedLaunch

__all__ = ["CudaKernel", "CudaLoader", "ensure_context", "default_device", "stream_handle",
           "current_stream", "clear_caches"]

_LOCK = threading.RLock()
_PRIMARY: dict[int, Any] = {}              # device ordinal -> retained primary CUcontext
_MODULES: dict[tuple[int, str], Any] = {}  # (device, code object sha256) -> CUmodule
_DEFAULT_SMEM_LIMIT = 48 * 1024            # above this a kernel must opt in
_RAW_STREAM: list[Callable[[int], int]] = []  # torch's current-stream lookup, chosen once


def clear_caches() -> None:
    """Forget cached contexts/modules (tests; after a fork, handles are not valid)."""
    with _LOCK:
        _PRIMARY.clear()
        _MODULES.clear()
        _RAW_STREAM.clear()


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


def _pick_raw_stream() -> Callable[[int], int]:
    try:
        import torch
    except ImportError:
        return lambda device: 0
    if not torch.cuda.is_available():
        return lambda device: 0
    # the raw cudaStream_t as an int, without building a torch.cuda.Stream (~1 us less)
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda device: int(torch.cuda.current_stream(device).cuda_stream)


def current_stream(device: int) -> int:
    """torch's current stream on `device` as a raw CUstream value (0 without torch CUDA)."""
    if not _RAW_STREAM:
        _RAW_STREAM.append(_pick_raw_stream())
    return _RAW_STREAM[0](device)


def stream_handle(stream: Any, device: int) -> int:
    """A raw CUstream value: None -> torch's current stream on `device` (0 without torch)."""
    if stream is None:
        return current_stream(device)
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
        self._fill = entry.pack_plan().fill
        self._tls = threading.local()  # per thread: (storage, params address, extra address)
        self._ctx: int | None = None   # the primary context's handle, once made current

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

    def _slot(self) -> tuple[Any, Any, int]:
        """This thread's kernarg buffer and the argument arrays pointing into it."""
        e, drv = self.entry, driver()
        buf = LaunchBuffer(bytes(e.kernarg_size))
        params = buf.params([a.offset for a in e.args]) if e.args else None
        extra = buf.extra(int(getattr(drv, "CU_LAUNCH_PARAM_BUFFER_POINTER", 1)),
                          int(getattr(drv, "CU_LAUNCH_PARAM_BUFFER_SIZE", 2)),
                          int(getattr(drv, "CU_LAUNCH_PARAM_END", 0)))
        slot = self._tls.slot = (buf, params, extra)
        return slot

    def launch(self, grid: int | tuple[int, ...], args: Mapping[str, Any] | bytes, *,
               stream: Any = None, shared_bytes: int | None = None,
               mode: str | None = None, trusted: bool = False) -> None:
        """Launch with `grid` blocks of the manifest's block_size on `stream` (torch's
        current stream by default). `args`: name -> value (see packplan.PackPlan) or
        already packed bytes. Asynchronous, like any launch: faults surface at the next sync.
        `trusted=True` skips the per-tensor checks (dtype, device, alignment) for callers
        that made them already.
        """
        if trusted and shared_bytes is None and mode is None and isinstance(args, Mapping):
            return self.launch_trusted(grid, args, stream)
        e = self.entry
        if isinstance(args, (bytes, bytearray)):
            data = bytes(args)
        else:  # trusted: the caller checked its tensors (see KernelEntry.pack_trusted)
            data = e.pack_trusted(args) if trusted else e.pack(args, device=self.device)
        if len(data) != e.kernarg_size:
            raise ValueError(f"kernel {e.name}: {len(data)} kernarg bytes, expected "
                             f"{e.kernarg_size}")
        mode = mode or self.mode
        if mode not in ("params", "buffer"):
            raise ValueError(f"launch mode must be 'params' or 'buffer', got {mode!r}")
        smem = e.dynamic_lds_bytes if shared_bytes is None else int(shared_bytes)
        ensure_context(self.device)
        if smem > self._smem_opt_in:
            self._opt_in_smem(smem)
        g = dim3(grid, "grid")
        slot = getattr(self._tls, "slot", None) or self._slot()
        ctypes.memmove(slot[0].storage, data, len(data))  # every byte the driver reads
        self._go(g, smem, stream_handle(stream, self.device), slot, mode)

    def launch_trusted(self, grid: int | tuple[int, ...], args: Mapping[str, Any],
                       stream: Any = None) -> None:
        """`launch(grid, args, trusted=True)` on the eager hot path: the entry's compiled
        PackPlan writes straight into this thread's kernarg buffer."""
        slot = getattr(self._tls, "slot", None) or self._slot()
        self._fill(slot[0].storage, args)
        drv = driver()
        res = drv.cuCtxGetCurrent()  # torch may have made another device's context current
        if int(res[0]) or res[1] is None or int(res[1]) != self._ctx:
            self._ctx = int(ensure_context(self.device))
        if grid.__class__ is not int or not 0 < grid < 1 << 32:
            return self._go(dim3(grid, "grid"), self.entry.dynamic_lds_bytes,
                            stream_handle(stream, self.device), slot, self.mode)
        h = current_stream(self.device) if stream is None else stream_handle(stream, self.device)
        # _go, inlined: this is the path of every eager collective
        params, extra = (slot[1], 0) if self.mode == "params" else (None, slot[2])
        e = self.entry
        res = drv.cuLaunchKernel(self.function, grid, 1, 1, e.block_size, 1, 1,
                                 e.dynamic_lds_bytes, h, params, extra)
        if int(res[0]):
            check(res, f"cuLaunchKernel({e.name}, grid={grid}, block={e.block_size}, "
                       f"smem={e.dynamic_lds_bytes})")

    def prepare(self, grid: int | tuple[int, ...], args: Mapping[str, Any],
                stream: Any = None) -> "PreparedLaunch":
        """This launch with `args` packed once, to be made many times: see
        prepared_launch.py. Trusted like `launch_trusted` (the caller checked `args`);
        `stream`: fixed for every launch, None for torch's current stream at each one."""
        from .prepared_launch import PreparedLaunch
        return PreparedLaunch(self, grid, args, stream)

    def _go(self, g: tuple[int, int, int], smem: int, h: int, slot: tuple[Any, Any, int],
            mode: str) -> None:
        e = self.entry
        params, extra = (slot[1], 0) if mode == "params" else (None, slot[2])
        res = driver().cuLaunchKernel(self.function, g[0], g[1], g[2], e.block_size, 1, 1,
                                      smem, h, params, extra)
        if int(res[0]):
            check(res, f"cuLaunchKernel({e.name}, grid={g}, block={e.block_size}, smem={smem})")


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
