"""CUDA virtual memory management: allocations shareable as POSIX file descriptors.

The communicator's meta buffers (Signal, LL scratch, staging) are created here on each
rank, exported as an fd, sent to peers with `fdpass.send_fd` over a unix socket, imported
and mapped there. GPU parts are marked [GPU]; `round_up` and the bookkeeping are plain.

Order (both sides): cuMemCreate / cuMemImportFromShareableHandle -> cuMemAddressReserve
-> cuMemMap -> cuMemSetAccess. Teardown reverses it: unmap, free the VA, release the
handle; the physical memory goes away when every process has released it.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

from ._driver import check, driver
from .loader import ensure_context

__all__ = ["VmmAllocation", "round_up", "granularity", "vmm_alloc", "vmm_export_fd",
           "vmm_import_fd", "vmm_free"]


def round_up(n: int, g: int) -> int:
    if g <= 0:
        raise ValueError("granularity must be positive")
    return (n + g - 1) // g * g


@dataclasses.dataclass
class VmmAllocation:
    ptr: int            # device virtual address of the mapping in this process
    size: int           # mapped bytes (a multiple of the granularity)
    handle: Any         # CUmemGenericAllocationHandle
    device: int
    imported: bool      # True when it came from a peer's fd
    freed: bool = False


def _prop(drv: Any, device: int) -> Any:
    prop = drv.CUmemAllocationProp()
    prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = (
        drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
    return prop


def granularity(device: int, *, recommended: bool = True) -> int:
    """[GPU] Allocation granularity for shareable device memory (2 MiB on H100/H200)."""
    drv = driver()
    ensure_context(device)
    flags = drv.CUmemAllocationGranularity_flags
    opt = (flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED if recommended
           else flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
    return int(check(drv.cuMemGetAllocationGranularity(_prop(drv, device), opt),
                     "cuMemGetAllocationGranularity"))


def _map(drv: Any, handle: Any, size: int, device: int,
         access_devices: Sequence[int] | None) -> int:
    g = granularity(device)
    ptr = int(check(drv.cuMemAddressReserve(size, g, 0, 0), "cuMemAddressReserve"))
    try:
        check(drv.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
        descs = []
        for d in (access_devices if access_devices is not None else [device]):
            desc = drv.CUmemAccessDesc()
            desc.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = int(d)
            desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            descs.append(desc)
        check(drv.cuMemSetAccess(ptr, size, descs, len(descs)), "cuMemSetAccess")
    except Exception:
        drv.cuMemUnmap(ptr, size)
        drv.cuMemAddressFree(ptr, size)
        raise
    return ptr


def vmm_alloc(size: int, device: int, *,
              access_devices: Sequence[int] | None = None) -> VmmAllocation:
    """[GPU] Allocate `size` bytes (rounded up to the granularity), exportable as an fd.

    access_devices: devices that may read/write it in this process (default: `device`).
    """
    drv = driver()
    ensure_context(device)
    size = round_up(int(size), granularity(device))
    handle = check(drv.cuMemCreate(size, _prop(drv, device), 0), f"cuMemCreate({size})")
    try:
        ptr = _map(drv, handle, size, device, access_devices)
    except Exception:
        drv.cuMemRelease(handle)
        raise
    return VmmAllocation(ptr, size, handle, device, imported=False)


def vmm_export_fd(alloc: VmmAllocation) -> int:
    """[GPU] A new fd for the allocation; send it with fdpass.send_fd, then os.close it."""
    drv = driver()
    ensure_context(alloc.device)
    fd = check(drv.cuMemExportToShareableHandle(
        alloc.handle, drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        0), "cuMemExportToShareableHandle")
    return int(fd)


def vmm_import_fd(fd: int, size: int, device: int, *,
                  access_devices: Sequence[int] | None = None) -> VmmAllocation:
    """[GPU] Import a peer's allocation from a received fd and map `size` bytes of it.

    The fd may be closed right after this returns (the driver holds its own reference).
    """
    drv = driver()
    ensure_context(device)
    # The fd travels as the pointer-sized osHandle value itself, (void*)(uintptr_t)fd.
    handle = check(drv.cuMemImportFromShareableHandle(
        int(fd), drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle")
    try:
        ptr = _map(drv, handle, int(size), device, access_devices)
    except Exception:
        drv.cuMemRelease(handle)
        raise
    return VmmAllocation(ptr, int(size), handle, device, imported=True)


def vmm_free(alloc: VmmAllocation) -> None:
    """[GPU] Unmap, free the address range and release the handle (idempotent). Marked
    freed before the driver calls: if one of them fails, a retry (a second close()) leaks
    what is left instead of unmapping or releasing anything twice."""
    if alloc.freed:
        return
    alloc.freed = True
    drv = driver()
    ensure_context(alloc.device)
    check(drv.cuMemUnmap(alloc.ptr, alloc.size), "cuMemUnmap")
    check(drv.cuMemAddressFree(alloc.ptr, alloc.size), "cuMemAddressFree")
    check(drv.cuMemRelease(alloc.handle), "cuMemRelease")


def share_with_peers(own: Any, rank: int, world: int, all_gather: Any,
                     device: int) -> tuple[list[int], list[Any]]:
    """Every rank's address of its allocation `own` (collective): this rank's handle is
    exported as a file descriptor, passed to each peer over a unix socket, and the peers'
    are mapped here. Returns (addresses by rank, the mappings made, for the caller to free);
    on a failure the mappings made so far are freed before the error propagates."""
    from .fdexchange import exchange_fds
    fd = vmm_export_fd(own)
    try:
        fds = exchange_fds(fd, rank, world, all_gather)
    finally:
        os.close(fd)
    addresses: list[int] = []
    mapped_here: list[Any] = []
    try:
        for peer_fd in fds:
            if peer_fd is None:
                addresses.append(own.ptr)
                continue
            try:
                mapped = vmm_import_fd(peer_fd, own.size, device)
            finally:
                os.close(peer_fd)
            mapped_here.append(mapped)
            addresses.append(mapped.ptr)
    except BaseException:
        for mapped in mapped_here:
            vmm_free(mapped)
        raise
    return addresses, mapped_here
