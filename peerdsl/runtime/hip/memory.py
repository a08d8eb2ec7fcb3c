"""HIP peer memory: VMM allocations shared as POSIX fds, and classic IPC handles. [GPU]

Same shapes as peerdsl.runtime.cuda.vmm / .ipc so the communicator can treat both alike.
HIP differences handled here: hipMemExportToShareableHandle writes the fd through an out
pointer (its first argument) instead of returning it; the import takes the fd as the
pointer-sized osHandle value, (void*)(uintptr_t)fd, like CUDA (ROCclr casts it back).
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

from ..cuda.ipc import IpcHandle
from ..cuda.vmm import VmmAllocation, round_up
from ._api import as_int, check, hip
from .loader import set_device

__all__ = ["hip_granularity", "hip_vmm_alloc", "hip_vmm_export_fd", "hip_vmm_import_fd",
           "hip_vmm_free", "hip_ipc_export", "hip_ipc_open", "VmmAllocation", "IpcHandle"]


def _prop(h: Any, device: int) -> Any:
    prop = h.hipMemAllocationProp()
    prop.type = h.hipMemAllocationType.hipMemAllocationTypePinned
    prop.location.type = h.hipMemLocationType.hipMemLocationTypeDevice
    prop.location.id = device
    kind = h.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor
    if hasattr(prop, "requestedHandleTypes"):
        prop.requestedHandleTypes = kind
    else:
        # hip-python 10 does not expose the anonymous union {requestedHandleType(s)} that
        # sits at byte 4 (after `type`, before `location`, as in CUmemAllocationProp).
        ctypes.c_int.from_address(int(prop) + 4).value = int(getattr(kind, "value", kind))
    return prop



def hip_granularity(device: int) -> int:
    h = hip()
    set_device(device)
    opt = h.hipMemAllocationGranularity_flags.hipMemAllocationGranularityRecommended
    return int(check(h.hipMemGetAllocationGranularity(_prop(h, device), opt),
                     "hipMemGetAllocationGranularity"))


def _map(h: Any, handle: Any, size: int, device: int,
         access_devices: Sequence[int] | None) -> int:
    ptr = check(h.hipMemAddressReserve(size, hip_granularity(device), None, 0),
                "hipMemAddressReserve")
    try:
        check(h.hipMemMap(ptr, size, 0, handle, 0), "hipMemMap")
        devs = list(access_devices) if access_devices is not None else [device]
        for d in devs:  # one descriptor per call: hip-python takes a single struct pointer
            desc = h.hipMemAccessDesc()
            desc.location.type = h.hipMemLocationType.hipMemLocationTypeDevice
            desc.location.id = int(d)
            desc.flags = h.hipMemAccessFlags.hipMemAccessFlagsProtReadWrite
            check(h.hipMemSetAccess(ptr, size, desc, 1), f"hipMemSetAccess(device {d})")
    except Exception:
        h.hipMemUnmap(ptr, size)
        h.hipMemAddressFree(ptr, size)
        raise
    return as_int(ptr)


def hip_vmm_alloc(size: int, device: int, *,
                  access_devices: Sequence[int] | None = None) -> VmmAllocation:
    h = hip()
    set_device(device)
    size = round_up(int(size), hip_granularity(device))
    handle = check(h.hipMemCreate(size, _prop(h, device), 0), f"hipMemCreate({size})")
    try:
        ptr = _map(h, handle, size, device, access_devices)
    except Exception:
        h.hipMemRelease(handle)
        raise
    return VmmAllocation(ptr, size, handle, device, imported=False)


def hip_vmm_export_fd(alloc: VmmAllocation) -> int:
    h = hip()
    set_device(alloc.device)
    fd = ctypes.c_int(-1)
    check(h.hipMemExportToShareableHandle(
        ctypes.addressof(fd), alloc.handle,
        h.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor, 0),
        "hipMemExportToShareableHandle")
    if fd.value < 0:
        raise RuntimeError("hipMemExportToShareableHandle returned no fd")
    return fd.value


def hip_vmm_import_fd(fd: int, size: int, device: int, *,
                      access_devices: Sequence[int] | None = None) -> VmmAllocation:
    h = hip()
    set_device(device)
    handle = check(h.hipMemImportFromShareableHandle(
        int(fd), h.hipMemAllocationHandleType.hipMemHandleTypePosixFileDescriptor),
        "hipMemImportFromShareableHandle")
    try:
        ptr = _map(h, handle, int(size), device, access_devices)
    except Exception:
        h.hipMemRelease(handle)
        raise
    return VmmAllocation(ptr, int(size), handle, device, imported=True)


def hip_vmm_free(alloc: VmmAllocation) -> None:
    if alloc.freed:
        return
    h = hip()
    set_device(alloc.device)
    check(h.hipMemUnmap(alloc.ptr, alloc.size), "hipMemUnmap")
    check(h.hipMemAddressFree(alloc.ptr, alloc.size), "hipMemAddressFree")
    check(h.hipMemRelease(alloc.handle), "hipMemRelease")
    alloc.freed = True


def hip_ipc_export(ptr: Any, size: int, device: int) -> IpcHandle:
    """IPC handle of the allocation holding `ptr` (int or tensor) plus the offset into it."""
    h = hip()
    set_device(device)
    addr = int(ptr.data_ptr()) if hasattr(ptr, "data_ptr") else int(ptr)
    base, _alloc = check(h.hipMemGetAddressRange(addr), "hipMemGetAddressRange")
    base = as_int(base)
    handle = check(h.hipIpcGetMemHandle(base), "hipIpcGetMemHandle")
    return IpcHandle(bytes(handle.reserved)[:64], addr - base, int(size))


def hip_ipc_open(hd: IpcHandle, device: int) -> int:
    h = hip()
    set_device(device)
    mh = h.hipIpcMemHandle_t()
    try:
        mh.reserved = hd.handle
    except AttributeError:  # read-only in hip-python 10: write the 64-byte struct directly
        ctypes.memmove(int(mh), hd.handle, len(hd.handle))
    flag = h.hipIpcMemLazyEnablePeerAccess  # a module-level constant in hip-python
    return as_int(check(h.hipIpcOpenMemHandle(mh, flag), "hipIpcOpenMemHandle")) + hd.offset
