"""CUDA IPC: share a device allocation (torch tensor or cuMemAlloc buffer) with peers.

GPU parts: `ipc_export`, `ipc_open`, `ipc_close` call the driver. CPU-testable parts: the
`IpcHandle` wire format. cuIpcGetMemHandle works on whole allocations, and torch's caching
allocator hands out pieces of larger cudaMalloc blocks, so the handle is taken for the
containing allocation (cuMemGetAddressRange) and the offset travels with it. Memory from
torch's expandable segments (VMM) cannot be shared this way: use `vmm` for those.
"""
from __future__ import annotations

import dataclasses
import struct
import threading
from typing import Any

from ._driver import check, driver
from .loader import ensure_context

__all__ = ["IpcHandle", "ipc_export", "ipc_open", "ipc_close", "IPC_HANDLE_BYTES"]

IPC_HANDLE_BYTES = 64
_WIRE = struct.Struct(f"<{IPC_HANDLE_BYTES}sQQ")


@dataclasses.dataclass(frozen=True)
class IpcHandle:
    handle: bytes   # CUipcMemHandle.reserved, 64 bytes
    offset: int     # of the shared pointer inside the allocation
    size: int       # bytes usable from the pointer on

    def __post_init__(self) -> None:
        if len(self.handle) != IPC_HANDLE_BYTES:
            raise ValueError(f"IPC handle must be {IPC_HANDLE_BYTES} bytes, got "
                             f"{len(self.handle)}")
        if self.offset < 0 or self.size < 0:
            raise ValueError("IPC offset and size must be >= 0")

    def to_bytes(self) -> bytes:
        return _WIRE.pack(self.handle, self.offset, self.size)

    @classmethod
    def from_bytes(cls, data: bytes) -> "IpcHandle":
        if len(data) != _WIRE.size:
            raise ValueError(f"IPC handle wire form is {_WIRE.size} bytes, got {len(data)}")
        h, off, size = _WIRE.unpack(data)
        return cls(h, off, size)


def _addr(ptr: Any) -> int:
    return int(ptr.data_ptr()) if hasattr(ptr, "data_ptr") else int(ptr)


def ipc_export(ptr: Any, size: int | None = None, *, device: int | None = None) -> IpcHandle:
    """[GPU] Handle for `ptr` (int address, e.g. from cuMemAlloc, or a torch tensor) that a
    peer process can open with `ipc_open`; send `handle.to_bytes()` to it."""
    drv = driver()
    if device is None:
        device = ptr.device.index if hasattr(ptr, "device") else 0
    ensure_context(int(device))
    addr = _addr(ptr)
    base, alloc_size = check(drv.cuMemGetAddressRange(addr), "cuMemGetAddressRange")
    base = int(base)
    offset = addr - base
    if size is None:  # a tensor's bytes, or for a bare address the rest of its allocation
        size = (ptr.numel() * ptr.element_size() if hasattr(ptr, "numel")
                else int(alloc_size) - offset)
    if offset + size > int(alloc_size):
        raise ValueError(f"range {addr:#x}+{size} leaves its allocation "
                         f"{base:#x}+{int(alloc_size)}")
    h = check(drv.cuIpcGetMemHandle(base), "cuIpcGetMemHandle")
    return IpcHandle(bytes(h.reserved), offset, int(size))


# A process may open a given handle only once; peers that share several buffers carved
# from one allocation would open it repeatedly, so opened bases are refcounted here.
_OPEN_LOCK = threading.Lock()
_OPENED: dict[tuple[int, bytes], list[int]] = {}   # (device, handle) -> [base, refcount]
_BY_PTR: dict[int, tuple[int, bytes]] = {}


def ipc_open(h: IpcHandle, *, device: int = 0) -> int:
    """[GPU] Map a peer's allocation here; returns the device address of the shared range."""
    drv = driver()
    ensure_context(device)
    key = (device, h.handle)
    with _OPEN_LOCK:
        ent = _OPENED.get(key)
        if ent is None:
            mh = drv.CUipcMemHandle()
            mh.reserved = h.handle
            flag = drv.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            base = int(check(drv.cuIpcOpenMemHandle(mh, flag), "cuIpcOpenMemHandle"))
            ent = _OPENED[key] = [base, 0]
        ent[1] += 1
        ptr = ent[0] + h.offset
        _BY_PTR[ptr] = key
        return ptr


def ipc_close(ptr: int) -> None:
    """[GPU] Drop one reference taken by `ipc_open`; unmaps when the last one goes."""
    drv = driver()
    with _OPEN_LOCK:
        key = _BY_PTR.get(ptr)
        if key is None:
            raise KeyError(f"{ptr:#x} was not returned by ipc_open")
        ent = _OPENED[key]
        ent[1] -= 1
        if ent[1] == 0:
            del _OPENED[key]
            for p in [p for p, k in _BY_PTR.items() if k == key]:
                del _BY_PTR[p]
            ensure_context(key[0])
            check(drv.cuIpcCloseMemHandle(ent[0]), "cuIpcCloseMemHandle")
