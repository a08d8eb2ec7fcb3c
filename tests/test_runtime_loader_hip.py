"""The HIP loader against a fake `hip` module (hip-python's shape) that records calls (CPU)."""
from __future__ import annotations

import ctypes
import enum
import struct
import sys
import types

import pytest

from peerdsl.runtime import hip as phip
from peerdsl.runtime.hip import _api
from peerdsl.runtime.kernarg import read_extra
from peerdsl.runtime.manifest import load_manifest
from test_runtime_loader_helpers import write_manifest

A, B, OUT = 0x7F0000000000, 0x7F0000010000, 0x7F0000020000


class hipError_t(enum.Enum):   # hip-python's enums are not ints: the loader uses .value
    hipSuccess = 0
    hipErrorInvalidValue = 1
    hipErrorInvalidImage = 200
    hipErrorNotFound = 500


class FakeHip:
    hipError_t = hipError_t
    HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3
    hipIpcMemLazyEnablePeerAccess = 1
    hipMemAllocationHandleType = types.SimpleNamespace(hipMemHandleTypePosixFileDescriptor=1)
    hipMemAllocationType = types.SimpleNamespace(hipMemAllocationTypePinned=1)
    hipMemLocationType = types.SimpleNamespace(hipMemLocationTypeDevice=1)
    hipMemAccessFlags = types.SimpleNamespace(hipMemAccessFlagsProtReadWrite=3)
    hipMemAllocationGranularity_flags = types.SimpleNamespace(
        hipMemAllocationGranularityRecommended=1)

    def __init__(self, fail=None):
        self.calls: list[tuple] = []
        self.device = 0
        self.fail = fail or {}
        self.launches: list[dict] = []

    def _rec(self, name, *args):
        self.calls.append((name, *args))
        return self.fail.get(name, hipError_t.hipSuccess)

    def names(self):
        return [c[0] for c in self.calls]

    def hipGetErrorString(self, err):
        return hipError_t.hipSuccess, f"fake {err.name}"

    def hipGetDevice(self):
        return self._rec("hipGetDevice"), self.device

    def hipSetDevice(self, d):
        self.device = d
        return (self._rec("hipSetDevice", d),)

    def hipModuleLoadData(self, image):
        return self._rec("hipModuleLoadData", bytes(image)), ("module", len(self.calls))

    def hipModuleGetFunction(self, module, name):
        return self._rec("hipModuleGetFunction", module, name), ("function", name)

    def hipModuleLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        words, data = read_extra(extra)   # only valid during the call, as for the runtime
        self.launches.append({"function": f, "grid": (gx, gy, gz), "block": (bx, by, bz),
                              "smem": smem, "stream": stream, "params": params,
                              "words": words, "kernargs": data, "device": self.device})
        return (self._rec("hipModuleLaunchKernel"),)

    # VMM / IPC
    def hipMemAllocationProp(self):
        return types.SimpleNamespace(location=types.SimpleNamespace(),
                                     requestedHandleTypes=None)

    def hipMemAccessDesc(self):
        return types.SimpleNamespace(location=types.SimpleNamespace())

    def hipMemGetAllocationGranularity(self, prop, opt):
        return self._rec("granularity", prop.requestedHandleTypes), 2 << 20

    def hipMemCreate(self, size, prop, flags):
        return self._rec("hipMemCreate", size), "handle"

    def hipMemAddressReserve(self, size, align, addr, flags):
        return self._rec("hipMemAddressReserve", size, align), 0x300000000

    def hipMemMap(self, ptr, size, off, handle, flags):
        return (self._rec("hipMemMap", ptr, size, handle),)

    def hipMemSetAccess(self, ptr, size, desc, count):
        return (self._rec("hipMemSetAccess", desc.location.id, desc.flags, count),)

    def hipMemExportToShareableHandle(self, out, handle, kind, flags):
        ctypes.c_int.from_address(out).value = 37   # the fd comes back through the pointer
        return (self._rec("export", handle, kind),)

    def hipMemImportFromShareableHandle(self, fd, kind):
        return self._rec("import", fd, kind), "imported"

    def hipMemUnmap(self, p, s):
        return (self._rec("hipMemUnmap", p, s),)

    def hipMemAddressFree(self, p, s):
        return (self._rec("hipMemAddressFree", p, s),)

    def hipMemRelease(self, h):
        return (self._rec("hipMemRelease", h),)


@pytest.fixture
def fake():
    phip.clear_caches()
    h = FakeHip()
    with _api.use_hip(h):
        yield h
    phip.clear_caches()


@pytest.fixture
def man(tmp_path):
    write_manifest(tmp_path, "gfx1250")
    write_manifest(tmp_path, "gfx942")
    return load_manifest(tmp_path, "gfx1250")


def test_import_without_hip_python(monkeypatch):
    monkeypatch.setattr(_api, "_hip", None)
    monkeypatch.setitem(sys.modules, "hip", None)
    with pytest.raises(ImportError, match="needs AMD's hip-python"):
        _api.hip()


def test_load_and_launch_exact_bytes(fake, man):
    loader = phip.HipLoader(man, device=2)
    k = loader.kernel("vector_add", T="bf16")
    assert loader.kernel("vector_add", T="bf16") is k
    assert fake.names()[:3] == ["hipGetDevice", "hipSetDevice", "hipModuleLoadData"]
    assert fake.calls[2][1] == man.get("vector_add_bf16").code_object()
    assert ("hipModuleGetFunction", ("module", 3), b"vector_add_bf16") in fake.calls
    k.launch((40, 2), {"a": A, "b": B, "out": OUT, "n": 10_000}, stream=0x51, shared_bytes=512)
    (rec,) = fake.launches
    assert rec["function"] == ("function", b"vector_add_bf16")
    assert rec["grid"] == (40, 2, 1) and rec["block"] == (256, 1, 1)
    assert rec["smem"] == 512 and rec["stream"] == 0x51 and rec["device"] == 2
    assert rec["params"] is None
    assert (rec["words"][0], rec["words"][2], rec["words"][4]) == (1, 2, 3)  # END is 3 on HIP
    assert rec["kernargs"] == struct.pack("<QQQi", A, B, OUT, 10_000)


def test_module_cache_per_sha_and_device(fake, man):
    phip.HipLoader(man, device=0).kernel("vector_add", T="bf16")
    phip.HipLoader(man, device=0).kernel("vector_add", T="bf16")
    assert fake.names().count("hipModuleLoadData") == 1
    phip.HipLoader(man, device=1).kernel("vector_add", T="bf16")
    assert fake.names().count("hipModuleLoadData") == 2


def test_peer_table_and_torch_stream(fake, man):
    k = phip.HipLoader(man, device=0).kernel("peer_probe", WORLD=8)
    k.launch(4, {"sig": [A, B, OUT, A + 64], "rank": 3, "world": 4, "epoch": 11, "scale": 0.25},
             stream=types.SimpleNamespace(cuda_stream=0x99))
    rec = fake.launches[0]
    assert rec["stream"] == 0x99 and len(rec["kernargs"]) == 88
    assert struct.unpack_from("<8Q", rec["kernargs"]) == (A, B, OUT, A + 64, A, A, A, A)
    assert struct.unpack_from("<iiqf", rec["kernargs"], 64) == (3, 4, 11, 0.25)


def test_errors_name_the_call(man):
    phip.clear_caches()
    with _api.use_hip(FakeHip(fail={"hipModuleLoadData": hipError_t.hipErrorInvalidImage})):
        with pytest.raises(RuntimeError, match=r"hipModuleLoadData\(vector_add_bf16.hsaco\) "
                           r"failed: hipErrorInvalidImage \(200\): fake hipErrorInvalidImage"):
            phip.HipLoader(man, device=0).kernel("vector_add", T="bf16")
    phip.clear_caches()
    with _api.use_hip(FakeHip(fail={"hipModuleLaunchKernel": hipError_t.hipErrorInvalidValue})):
        k = phip.HipLoader(man, device=0).kernel("vector_add", T="bf16")
        with pytest.raises(RuntimeError, match="hipModuleLaunchKernel.*hipErrorInvalidValue"):
            k.launch(1, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0)
        with pytest.raises(Exception, match="missing arguments"):
            k.launch(1, {"a": A, "b": B, "out": OUT}, stream=0)
    phip.clear_caches()


def test_loader_rejects_nvidia_manifest(tmp_path, fake):
    write_manifest(tmp_path, "sm_90")
    with pytest.raises(ValueError, match="needs an AMD manifest"):
        phip.HipLoader(tmp_path, "sm_90")
    write_manifest(tmp_path, "gfx942")
    assert phip.HipLoader(tmp_path, "gfx942", device=0).manifest.wave_size == 64


def test_prop_union_written_where_hip_python_hides_it():
    """hip-python 10 has no requestedHandleTypes on hipMemAllocationProp: the loader writes
    the union at byte 4 (checked against the real struct where hip-python is installed)."""
    from peerdsl.runtime.hip import memory

    class Prop(ctypes.Structure):   # the C layout: type, union, location {type, id}, ...
        _fields_ = [("type_", ctypes.c_int), ("handle_types", ctypes.c_int),
                    ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                    ("meta", ctypes.c_void_p), ("flags", ctypes.c_uint32)]

    class HiddenUnion:
        def __init__(self):
            self.raw = Prop()
            self.location = types.SimpleNamespace()

        def __int__(self):
            return ctypes.addressof(self.raw)

    h = FakeHip()
    h.hipMemAllocationProp = HiddenUnion
    p = memory._prop(h, 3)
    assert p.raw.handle_types == 1 and p.location.id == 3
    try:
        from hip import hip as real
    except ImportError:
        return
    prop = memory._prop(real, 3)   # keep it alive while its memory is read
    raw = ctypes.string_at(int(prop), 16)
    assert struct.unpack("<4i", raw) == (1, 1, 1, 3)


def test_vmm_export_import(fake):
    a = phip.hip_vmm_alloc(1 << 20, 0, access_devices=[0, 1])
    assert a.size == 2 << 20 and a.ptr == 0x300000000
    assert [c for c in fake.calls if c[0] == "hipMemSetAccess"] == [
        ("hipMemSetAccess", 0, 3, 1), ("hipMemSetAccess", 1, 3, 1)]
    assert phip.hip_vmm_export_fd(a) == 37 and ("export", "handle", 1) in fake.calls
    b = phip.hip_vmm_import_fd(37, 2 << 20, 0)
    assert b.imported and ("import", 37, 1) in fake.calls
    phip.hip_vmm_free(b)
    assert fake.names()[-3:] == ["hipMemUnmap", "hipMemAddressFree", "hipMemRelease"]
