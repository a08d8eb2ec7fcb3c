"""Fakes of `cuda.bindings.driver` shared by the CUDA loader and memory tests (CPU)."""
from __future__ import annotations

import enum
import types

from peerdsl.runtime.kernarg import read_extra, read_params

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
