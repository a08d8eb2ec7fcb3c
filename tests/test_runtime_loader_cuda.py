"""The CUDA loader against a fake `cuda.bindings.driver` that records every call (CPU)."""
from __future__ import annotations

import struct
import sys
import types

import pytest

from peerdsl.runtime import cuda as pcuda
from peerdsl.runtime.cuda import _driver
from cuda_fakes import CUresult, Handle, FakeDriver, VA_LAYOUT, A, B, OUT


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
