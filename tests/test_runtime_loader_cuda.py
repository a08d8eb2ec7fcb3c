"""The CUDA loader against a fake `cuda.bindings.driver` that records every call (CPU)."""
from __future__ import annotations

import ctypes
import enum
import os
import struct
import sys
import types
from typing import Any

import pytest

from peerdsl.runtime import cuda as pcuda
from peerdsl.runtime.cuda import _driver
from peerdsl.runtime.kernarg import read_extra, read_params
from peerdsl.runtime.manifest import load_manifest
from test_runtime_loader_helpers import write_manifest

A, B, OUT = 0x7F0000000000, 0x7F0000010000, 0x7F0000020000


class CUresult(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_NOT_SUPPORTED = 801


class CUfunction_attribute(enum.IntEnum):
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class Handle(int):
    """Driver handles: ints with a kind, so the recorded calls read well."""


class FakeDriver:
    CUresult = CUresult
    CUfunction_attribute = CUfunction_attribute
    CU_LAUNCH_PARAM_BUFFER_POINTER, CU_LAUNCH_PARAM_BUFFER_SIZE, CU_LAUNCH_PARAM_END = 1, 2, 0
    CUipcMem_flags = types.SimpleNamespace(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS=1)
    CUmemAllocationHandleType = types.SimpleNamespace(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR=1)
    CUmemAllocationType = types.SimpleNamespace(CU_MEM_ALLOCATION_TYPE_PINNED=1)
    CUmemLocationType = types.SimpleNamespace(CU_MEM_LOCATION_TYPE_DEVICE=1)
    CUmemAccess_flags = types.SimpleNamespace(CU_MEM_ACCESS_FLAGS_PROT_READWRITE=3)
    CUmemAllocationGranularity_flags = types.SimpleNamespace(
        CU_MEM_ALLOC_GRANULARITY_MINIMUM=0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED=1)

    def __init__(self, param_layout=None, max_threads=1024, fail=None):
        self.calls: list[tuple] = []
        self.current = Handle(0)
        self.param_layout = param_layout   # per symbol: [(offset, size)]
        self.max_threads = max_threads
        self.fail = fail or {}             # call name -> CUresult to return
        self.launches: list[dict] = []

    def _rec(self, name, *args):
        self.calls.append((name, *args))
        return self.fail.get(name, CUresult.CUDA_SUCCESS)

    def names(self):
        return [c[0] for c in self.calls]

    def cuGetErrorString(self, err):
        return CUresult.CUDA_SUCCESS, f"fake description of {CUresult(err).name}".encode()

    def cuInit(self, flags):
        return (self._rec("cuInit", flags),)

    def cuDeviceGet(self, ordinal):
        return self._rec("cuDeviceGet", ordinal), Handle(100 + ordinal)

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._rec("cuDevicePrimaryCtxRetain", int(dev)), Handle(0xC000 + int(dev))

    def cuCtxGetCurrent(self):
        return self._rec("cuCtxGetCurrent"), self.current

    def cuCtxSetCurrent(self, ctx):
        self.current = ctx
        return (self._rec("cuCtxSetCurrent", int(ctx)),)

    def cuModuleLoadData(self, image):
        return self._rec("cuModuleLoadData", bytes(image)), Handle(0x4000 + len(self.calls))

    def cuModuleGetFunction(self, module, name):
        assert isinstance(name, bytes)
        return self._rec("cuModuleGetFunction", int(module), name), FakeFunc(name.decode())

    def cuFuncGetAttribute(self, attr, func):
        vals = {0: self.max_threads, 1: 0, 3: 0, 4: 32}
        return self._rec("cuFuncGetAttribute", attr), vals.get(int(attr), 0)

    def cuFuncGetParamInfo(self, func, i):
        if self.param_layout is None:   # a driver older than 12.4: the check is skipped
            return CUresult.CUDA_ERROR_NOT_SUPPORTED, 0, 0
        layout = self.param_layout.get(func.symbol, [])
        if i >= len(layout):
            return CUresult.CUDA_ERROR_INVALID_VALUE, 0, 0
        return (CUresult.CUDA_SUCCESS, *layout[i])

    def cuFuncSetAttribute(self, func, attr, value):
        return (self._rec("cuFuncSetAttribute", func.symbol, int(attr), value),)

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        # Decode the argument memory now: it is only valid during the call, as for the driver.
        rec = {"symbol": f.symbol, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
               "stream": stream, "ctx": int(self.current)}
        if params is not None:
            rec["params"] = read_params(params, f.sizes)
        rec["extra"] = read_extra(extra) if extra else None
        self.launches.append(rec)
        return (self._rec("cuLaunchKernel", f.symbol),)


class FakeFunc:
    def __init__(self, symbol):
        self.symbol = symbol
        self.sizes = [8, 8, 8, 4] if symbol.startswith("vector_add") else [8] * 8 + [4, 4, 8, 4]


VA_LAYOUT = [(0, 8), (8, 8), (16, 8), (24, 4)]
PEER_LAYOUT = [(8 * i, 8) for i in range(8)] + [(64, 4), (68, 4), (72, 8), (80, 4)]


@pytest.fixture
def fake():
    pcuda.clear_caches()
    drv = FakeDriver(param_layout={"vector_add_bf16": VA_LAYOUT, "vector_add_f16": VA_LAYOUT,
                                   "peer_probe_w8": PEER_LAYOUT})
    with _driver.use_driver(drv):
        yield drv
    pcuda.clear_caches()


@pytest.fixture
def man(tmp_path):
    write_manifest(tmp_path)
    return load_manifest(tmp_path, "sm_90")


def test_import_without_cuda_bindings(monkeypatch):
    monkeypatch.setattr(_driver, "_driver", None)
    monkeypatch.setitem(sys.modules, "cuda", None)          # makes `import cuda...` fail
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(ImportError, match="needs NVIDIA's cuda-bindings"):
        _driver.driver()


def test_load_uses_primary_context_and_caches_modules(fake, man):
    loader = pcuda.CudaLoader(man, device=1)
    k = loader.kernel("vector_add", T="bf16")
    assert loader.kernel("vector_add", T="bf16") is k
    names = fake.names()
    assert names[:5] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent",
                         "cuCtxSetCurrent"]
    assert ("cuDeviceGet", 1) in fake.calls and int(fake.current) == 0xC000 + 101
    loads = [c for c in fake.calls if c[0] == "cuModuleLoadData"]
    assert len(loads) == 1 and loads[0][1] == man.get("vector_add_bf16").code_object()
    getf = [c for c in fake.calls if c[0] == "cuModuleGetFunction"]
    assert [c[2] for c in getf] == [b"vector_add_bf16"]
    assert k.attributes["param_layout_checked"] == 1 and k.attributes["num_regs"] == 32
    # a second loader (same device, same file) reuses the module; another file loads anew
    pcuda.CudaLoader(man, device=1).kernel("vector_add", T="bf16")
    pcuda.CudaLoader(man, device=1).kernel("vector_add", T="f16")
    assert fake.names().count("cuModuleLoadData") == 2
    assert fake.names().count("cuDevicePrimaryCtxRetain") == 1   # retained once per device


@pytest.mark.parametrize("mode", ["params", "buffer"])
def test_launch_bytes_grid_block_stream(fake, man, mode):
    k = pcuda.CudaLoader(man, device=0, mode=mode).kernel("vector_add", T="bf16")
    k.launch(7, {"a": A, "b": B, "out": OUT, "n": 1700}, stream=0x5EED)
    (rec,) = fake.launches
    packed = struct.pack("<QQQi", A, B, OUT, 1700)
    assert rec["grid"] == (7, 1, 1) and rec["block"] == (256, 1, 1)
    assert rec["smem"] == 0 and rec["stream"] == 0x5EED and rec["ctx"] == 0xC000 + 100
    if mode == "params":
        assert rec["params"] == [packed[0:8], packed[8:16], packed[16:24], packed[24:28]]
        assert rec["extra"] is None
    else:
        words, data = rec["extra"]
        assert "params" not in rec and (words[0], words[2], words[4]) == (1, 2, 0)
        assert data == packed


def test_launch_peer_table_and_stream_object(fake, man):
    k = pcuda.CudaLoader(man, device=0).kernel("peer_probe")
    stream = types.SimpleNamespace(cuda_stream=0xABC)   # what torch.cuda.Stream exposes
    k.launch((2, 3), {"sig": [A, B], "rank": 1, "world": 2, "epoch": 9, "scale": 2.0},
             stream=stream, mode="buffer")
    rec = fake.launches[0]
    assert rec["grid"] == (2, 3, 1) and rec["stream"] == 0xABC
    data = rec["extra"][1]
    assert struct.unpack_from("<8Q", data) == (A, B, A, A, A, A, A, A)
    assert struct.unpack_from("<iiqf", data, 64) == (1, 2, 9, 2.0)
    k.launch(1, data, stream=0)                         # pre-packed bytes pass through
    assert fake.launches[1]["params"][8] == struct.pack("<i", 1)
    with pytest.raises(ValueError, match="kernarg bytes"):
        k.launch(1, data[:-1], stream=0)


def test_context_switched_back_before_launch(fake, man):
    k = pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    fake.current = Handle(0xDEAD)   # someone else's context became current on this thread
    k.launch(1, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0)
    assert fake.launches[0]["ctx"] == 0xC000 + 100


def test_errors_name_the_call(man):
    pcuda.clear_caches()
    drv = FakeDriver(fail={"cuModuleLoadData": CUresult.CUDA_ERROR_INVALID_IMAGE})
    with _driver.use_driver(drv):
        with pytest.raises(RuntimeError, match=r"cuModuleLoadData\(vector_add_bf16.cubin\) "
                           r"failed: CUDA_ERROR_INVALID_IMAGE \(200\): fake description"):
            pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    pcuda.clear_caches()
    drv = FakeDriver(fail={"cuLaunchKernel": CUresult.CUDA_ERROR_INVALID_VALUE})
    with _driver.use_driver(drv):
        k = pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
        with pytest.raises(RuntimeError, match=r"cuLaunchKernel\(vector_add_bf16, grid=\(3, 1, "
                           r"1\), block=256, smem=0\) failed: CUDA_ERROR_INVALID_VALUE"):
            k.launch(3, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0)
        with pytest.raises(ValueError, match="launch mode"):
            k.launch(3, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0, mode="fast")
    pcuda.clear_caches()


def test_layout_mismatch_and_block_limit(man):
    pcuda.clear_caches()
    bad = FakeDriver(param_layout={"vector_add_bf16": [(0, 8), (8, 8), (16, 8), (28, 4)]})
    with _driver.use_driver(bad):
        with pytest.raises(RuntimeError, match="differs from the cubin's"):
            pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    pcuda.clear_caches()
    small = FakeDriver(param_layout={"vector_add_bf16": VA_LAYOUT}, max_threads=128)
    with _driver.use_driver(small):
        with pytest.raises(RuntimeError, match="block_size 256 exceeds the cubin's limit of 128"):
            pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    pcuda.clear_caches()


def test_dynamic_shared_memory_opt_in(fake, man):
    k = pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    k.launch(1, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0, shared_bytes=100_000)
    assert ("cuFuncSetAttribute", "vector_add_bf16", 8, 100_000) in fake.calls
    assert fake.launches[0]["smem"] == 100_000
    k.launch(1, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0, shared_bytes=90_000)
    assert fake.names().count("cuFuncSetAttribute") == 1


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
