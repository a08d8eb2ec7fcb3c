"""CUDA IPC and VMM helpers, and the two-process selftest, against fake drivers (CPU)."""
from __future__ import annotations

from typing import Any

import ctypes
import os
import types

import pytest

from peerdsl.runtime import cuda as pcuda
from peerdsl.runtime.cuda import _driver
from cuda_fakes import CUresult, Handle, FakeDriver, A


def test_ipc_export_open_close(fake):
    class IpcDriver(FakeDriver):
        def cuMemGetAddressRange(self, p):
            return self._rec("cuMemGetAddressRange", p), Handle(A), 1 << 20

        def cuIpcGetMemHandle(self, base):
            self._rec("cuIpcGetMemHandle", int(base))
            return CUresult.CUDA_SUCCESS, types.SimpleNamespace(reserved=bytes([7]) * 64)

        def CUipcMemHandle(self):
            return types.SimpleNamespace(reserved=b"")

        def cuIpcOpenMemHandle(self, h, flags):
            return self._rec("cuIpcOpenMemHandle", h.reserved, flags), Handle(0x9000000)

        def cuIpcCloseMemHandle(self, p):
            return (self._rec("cuIpcCloseMemHandle", int(p)),)

    drv = IpcDriver()
    with _driver.use_driver(drv):
        h = pcuda.ipc_export(A + 4096, 256, device=0)
        assert (h.offset, h.size, h.handle) == (4096, 256, bytes([7]) * 64)
        assert ("cuIpcGetMemHandle", A) in drv.calls
        assert pcuda.ipc_export(A + 64, device=0).size == (1 << 20) - 64  # rest of the alloc
        with pytest.raises(ValueError, match="leaves its allocation"):
            pcuda.ipc_export(A + (1 << 20) - 8, 64, device=0)
        p1 = pcuda.ipc_open(pcuda.IpcHandle.from_bytes(h.to_bytes()), device=0)
        p2 = pcuda.ipc_open(h, device=0)
        assert p1 == p2 == 0x9000000 + 4096 and drv.names().count("cuIpcOpenMemHandle") == 1
        pcuda.ipc_close(p1)
        assert "cuIpcCloseMemHandle" not in drv.names()
        pcuda.ipc_close(p2)
        assert ("cuIpcCloseMemHandle", 0x9000000) in drv.calls
        with pytest.raises(KeyError):
            pcuda.ipc_close(p2)


def test_vmm_sequence(fake):
    class VmmDriver(FakeDriver):
        def CUmemAllocationProp(self):
            return types.SimpleNamespace(location=types.SimpleNamespace())

        def CUmemAccessDesc(self):
            return types.SimpleNamespace(location=types.SimpleNamespace())

        def cuMemGetAllocationGranularity(self, prop, opt):
            assert prop.requestedHandleTypes == 1 and prop.location.id == 0
            return self._rec("granularity", opt), 2 << 20

        def cuMemCreate(self, size, prop, flags):
            return self._rec("cuMemCreate", size), Handle(0x77)

        def cuMemAddressReserve(self, size, align, addr, flags):
            return self._rec("cuMemAddressReserve", size, align), Handle(0x200000000)

        def cuMemMap(self, ptr, size, off, handle, flags):
            return (self._rec("cuMemMap", ptr, size, int(handle)),)

        def cuMemSetAccess(self, ptr, size, descs, count):
            return (self._rec("cuMemSetAccess", ptr, size,
                              [(d.location.id, d.flags) for d in descs], count),)

        def cuMemExportToShareableHandle(self, handle, kind, flags):
            return self._rec("export", int(handle), kind), 42

        def cuMemImportFromShareableHandle(self, fd, kind):
            return self._rec("import", fd, kind), Handle(0x88)

        def cuMemUnmap(self, p, s):
            return (self._rec("cuMemUnmap", p, s),)

        def cuMemAddressFree(self, p, s):
            return (self._rec("cuMemAddressFree", p, s),)

        def cuMemRelease(self, h):
            return (self._rec("cuMemRelease", int(h)),)

    drv = VmmDriver()
    with _driver.use_driver(drv):
        a = pcuda.vmm_alloc(3 << 20, 0, access_devices=[0, 1])
        assert a.size == 4 << 20 and a.ptr == 0x200000000 and not a.imported
        assert ("cuMemCreate", 4 << 20) in drv.calls
        assert ("cuMemSetAccess", a.ptr, 4 << 20, [(0, 3), (1, 3)], 2) in drv.calls
        assert pcuda.vmm_export_fd(a) == 42 and ("export", 0x77, 1) in drv.calls
        b = pcuda.vmm_import_fd(42, 4 << 20, 0)
        assert b.imported and ("import", 42, 1) in drv.calls
        pcuda.vmm_free(a)
        pcuda.vmm_free(a)   # idempotent
        assert drv.names()[-3:] == ["cuMemUnmap", "cuMemAddressFree", "cuMemRelease"]
        assert drv.names().count("cuMemRelease") == 1


class HostMemDriver(FakeDriver):
    """VMM on host memory: physical handles are ctypes buffers, fds are pipes (found again by
    inode after SCM_RIGHTS), virtual addresses map onto the physical buffers."""

    def __init__(self):
        super().__init__()
        self.phys: dict[int, Any] = {}
        self.maps: dict[int, tuple[int, int]] = {}   # va -> (phys address, size)
        self.by_inode: dict[int, int] = {}
        self._va = 0x6000_0000_0000

    def _addr(self, ptr, n):
        for va, (pa, size) in self.maps.items():
            if va <= ptr and ptr + n <= va + size:
                return pa + ptr - va
        raise AssertionError(f"unmapped access {ptr:#x}+{n}")

    CUmemAllocationProp = staticmethod(lambda: types.SimpleNamespace(
        location=types.SimpleNamespace()))
    CUmemAccessDesc = CUmemAllocationProp

    def cuMemGetAllocationGranularity(self, prop, opt):
        return CUresult.CUDA_SUCCESS, 1 << 16

    def cuMemCreate(self, size, prop, flags):
        h = 0x100 + len(self.phys)
        self.phys[h] = (ctypes.c_uint8 * size)()
        return CUresult.CUDA_SUCCESS, h

    def cuMemAddressReserve(self, size, align, addr, flags):
        self._va += 1 << 32
        return CUresult.CUDA_SUCCESS, self._va

    def cuMemMap(self, ptr, size, off, handle, flags):
        self.maps[ptr] = (ctypes.addressof(self.phys[handle]), size)
        return (CUresult.CUDA_SUCCESS,)

    def cuMemSetAccess(self, ptr, size, descs, count):
        return (CUresult.CUDA_SUCCESS,)

    def cuMemExportToShareableHandle(self, handle, kind, flags):
        r, w = os.pipe()
        os.close(w)
        self.by_inode[os.fstat(r).st_ino] = handle
        return CUresult.CUDA_SUCCESS, r

    def cuMemImportFromShareableHandle(self, fd, kind):
        return CUresult.CUDA_SUCCESS, self.by_inode[os.fstat(fd).st_ino]

    def cuMemsetD32(self, ptr, value, n):
        (ctypes.c_uint32 * n).from_address(self._addr(ptr, 4 * n))[:] = [value] * n
        return (CUresult.CUDA_SUCCESS,)

    def cuMemcpyDtoH(self, host, ptr, nbytes):
        ctypes.memmove((ctypes.c_char * nbytes).from_buffer(host), self._addr(ptr, nbytes),
                       nbytes)
        return (CUresult.CUDA_SUCCESS,)

    def cuCtxSynchronize(self):
        return (CUresult.CUDA_SUCCESS,)

    def cuMemUnmap(self, p, s):
        del self.maps[p]
        return (CUresult.CUDA_SUCCESS,)

    def cuMemAddressFree(self, p, s):
        return (CUresult.CUDA_SUCCESS,)

    def cuMemRelease(self, h):
        return (CUresult.CUDA_SUCCESS,)


def test_vmm_selftest_protocol_on_host_memory():
    """The two-party VMM self-test (fd over SCM_RIGHTS, import, map, read, write back) with
    the peer in a thread and a host-memory driver: the same code the GPU proof runs."""
    from peerdsl.runtime.cuda import selftest
    pcuda.clear_caches()
    drv = HostMemDriver()
    with _driver.use_driver(drv):
        assert "child read 7s" in selftest.run_vmm_selftest(0, in_thread=True)
    assert not drv.maps   # both mappings were unmapped
    pcuda.clear_caches()


def test_selftest_child_process_reports_errors():
    """The real child process starts (python -m ...selftest --child FD), speaks the protocol
    over the inherited socket, and reports why it cannot work instead of hanging."""
    import socket as _socket
    from peerdsl.runtime.cuda import selftest
    child = selftest._Child(0)
    try:
        r = child.ask({"kind": "ipc", "handle": "00" * 80, "n": 1, "expect": [0], "write": 1})
        assert r["ok"] is False and r["detail"]
        a, b = _socket.socketpair()
        try:
            r = child.ask({"kind": "vmm", "size": 1, "n": 1, "expect": [0], "write": 1},
                          fd=a.fileno())
            assert r["ok"] is False
        finally:
            a.close()
            b.close()
    finally:
        child.close()
    assert child.proc.returncode == 0
