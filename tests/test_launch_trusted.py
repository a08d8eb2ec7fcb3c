"""The CUDA loader's trusted launch (the communicators' eager path) against the fake driver:
the same bytes, grid, block and stream as the checked launch, from a per-thread buffer that is
refilled in place, with the primary context made current when another one is (CPU)."""
from __future__ import annotations

import struct
import threading

import pytest
import torch
from cuda_fakes import OUT, A, B, CUresult, FakeDriver, Handle

from peerdsl.runtime import cuda as pcuda
from peerdsl.runtime.cuda import _driver
from peerdsl.runtime.cuda import loader as cloader

PEER = {"rank": 1, "world": 2, "epoch": -9, "scale": 2.0}


@pytest.mark.parametrize("mode", ["params", "buffer"])
def test_trusted_launch_matches_the_checked_one(fake, man, mode):
    k = pcuda.CudaLoader(man, device=0, mode=mode).kernel("peer_probe")
    for peers in ([A], [A, B], [A + 16 * i for i in range(8)]):
        values = dict(PEER, sig=peers)
        k.launch(3, values, stream=0x5EED)                   # checked
        k.launch_trusted(3, values, stream=0x5EED)           # trusted
        k.launch(3, values, stream=0x5EED, trusted=True)     # the same, through launch()
        checked, trusted, routed = fake.launches[-3:]
        assert trusted == checked == routed
    va = pcuda.CudaLoader(man, device=0, mode=mode).kernel("vector_add", T="bf16")
    t = torch.zeros(8, dtype=torch.bfloat16)  # the trusted path takes tensors unchecked
    va.launch_trusted((2, 3), {"a": t, "b": B, "out": None, "n": 5}, stream=7)
    va.launch((2, 3), {"a": t.data_ptr(), "b": B, "out": None, "n": 5}, stream=7)
    assert fake.launches[-1] == fake.launches[-2]
    assert fake.launches[-1]["grid"] == (2, 3, 1)


def test_buffer_is_refilled_not_stale(fake, man):
    k = pcuda.CudaLoader(man, device=0, mode="buffer").kernel("peer_probe")
    k.launch_trusted(1, dict(PEER, sig=[A + 16 * i for i in range(8)]), stream=0)
    k.launch_trusted(1, dict(PEER, sig=[B], rank=0), stream=0)
    data = fake.launches[-1]["extra"][1]
    assert struct.unpack_from("<8Q", data) == (B,) * 8
    assert struct.unpack_from("<iiqf", data, 64) == (0, 2, -9, 2.0)
    # a checked launch of packed bytes into the same buffer, then a trusted one again
    k.launch(1, bytes(88), stream=0)
    assert fake.launches[-1]["extra"][1] == bytes(88)
    k.launch_trusted(1, dict(PEER, sig=[A]), stream=0)
    assert struct.unpack_from("<Q", fake.launches[-1]["extra"][1], 56)[0] == A


def test_each_thread_has_its_own_buffer(fake, man):
    k = pcuda.CudaLoader(man, device=0, mode="buffer").kernel("peer_probe")
    results: dict[int, int] = {}
    barrier = threading.Barrier(4)

    def worker(r: int) -> None:
        barrier.wait()
        for i in range(50):
            k.launch_trusted(1, dict(PEER, sig=[A + 4096 * r], epoch=i), stream=r)
        results[r] = k._tls.slot[0].address
        barrier.wait()  # all alive at once, so no buffer is freed and its address reused

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results.values())) == 4
    for rec in fake.launches:  # every launch carried its own thread's values
        sig0 = struct.unpack_from("<Q", rec["extra"][1])[0]
        assert sig0 == A + 4096 * rec["stream"]


def test_trusted_launch_restores_the_primary_context(fake, man):
    k = pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    args = {"a": A, "b": B, "out": OUT, "n": 1}
    k.launch_trusted(1, args, stream=0)
    sets = fake.names().count("cuCtxSetCurrent")
    k.launch_trusted(1, args, stream=0)           # already current: nothing to set
    assert fake.names().count("cuCtxSetCurrent") == sets
    fake.current = Handle(0xDEAD)   # torch switched this thread to another device
    k.launch_trusted(1, args, stream=0)
    assert fake.launches[-1]["ctx"] == 0xC000 + 100
    assert fake.names().count("cuCtxSetCurrent") == sets + 1


def test_default_stream_is_torchs_current_one(fake, man, monkeypatch):
    k = pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
    args = {"a": A, "b": B, "out": OUT, "n": 1}
    k.launch_trusted(1, args)
    assert fake.launches[-1]["stream"] == (0 if not torch.cuda.is_available() else
                                           torch.cuda.current_stream(0).cuda_stream)
    monkeypatch.setattr(cloader, "_RAW_STREAM", [lambda device: 0xC0FFEE + device])
    k.launch_trusted(1, args)
    assert fake.launches[-1]["stream"] == 0xC0FFEE
    assert pcuda.stream_handle(None, 0) == 0xC0FFEE


def test_trusted_launch_errors_name_the_call(man):
    pcuda.clear_caches()
    drv = FakeDriver(fail={"cuLaunchKernel": CUresult.CUDA_ERROR_INVALID_VALUE})
    with _driver.use_driver(drv):
        k = pcuda.CudaLoader(man, device=0).kernel("vector_add", T="bf16")
        with pytest.raises(RuntimeError, match=r"cuLaunchKernel\(vector_add_bf16, grid=4, "
                           r"block=256, smem=0\) failed: CUDA_ERROR_INVALID_VALUE"):
            k.launch_trusted(4, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0)
        with pytest.raises(ValueError, match="grid dimensions"):
            k.launch_trusted(0, {"a": A, "b": B, "out": OUT, "n": 1}, stream=0)
        with pytest.raises(struct.error):
            k.launch_trusted(1, {"a": A, "b": B, "out": OUT, "n": 2**31}, stream=0)
    pcuda.clear_caches()
