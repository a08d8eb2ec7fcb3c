"""The lowering's real manifests load in the runtime (the contract between the two sides).

Builds vector_add and barrier_probe for sm_90 and gfx1250 with the ahead-of-time pipeline
(skipped where the build extras are missing), then loads them with the MLIR-free runtime:
sha256 and ELF headers check out, arguments pack at the code objects' offsets, and the
launch calls carry those bytes (fake drivers; the real launch is scripts/gpu_proof_loader.py).
"""
from __future__ import annotations

import struct

import pytest

pytest.importorskip("flydsl", reason="the ahead-of-time build needs flydsl (pip install -e .[build])")

from peerdsl.runtime import cuda as pcuda  # noqa: E402
from peerdsl.runtime import hip as phip  # noqa: E402
from peerdsl.runtime.manifest import load_manifest  # noqa: E402
from test_runtime_loader_cuda import FakeDriver  # noqa: E402
from test_runtime_loader_hip import FakeHip  # noqa: E402

A, B, OUT = 0x7F0000000000, 0x7F0000010000, 0x7F0000020000


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from peerdsl.lowering.build import build
    out = tmp_path_factory.mktemp("build")
    try:
        for arch in ("sm_90", "gfx1250"):
            build(arch, ["vector_add", "barrier_probe"], str(out), use_cache=False)
    except Exception as e:   # a missing ptxas/ld.lld is the build's business, not ours
        pytest.skip(f"ahead-of-time build unavailable here: {type(e).__name__}: {e}")
    return out


@pytest.mark.parametrize("arch", ["sm_90", "gfx1250"])
def test_built_manifest_loads_and_packs(built, arch):
    m = load_manifest(built, arch)
    va = m.find("vector_add", T="bf16")
    assert [a.type.is_pointer for a in va.args] == [True, True, True, False]
    data = va.pack({"a": A, "b": B, "out": OUT, va.args[3].name: 12345})
    assert struct.unpack_from("<QQQi", data) == (A, B, OUT, 12345)
    for W in (2, 4, 8):
        bp = m.find("barrier_probe", W=W)
        assert set(bp.peer_tables) == {"sig", "slots"}
        packed = bp.pack({"sig": [A + 4096 * r for r in range(W)], "slots": [B] * W,
                          "counter": OUT, "out": OUT + 64, "rank": W - 1,
                          "counter_target": 8, "stamp": 1})
        sig0 = next(a for a in bp.args if a.name == "sig_0").offset
        sig7 = next(a for a in bp.args if a.name == "sig_7").offset
        assert struct.unpack_from("<Q", packed, sig0)[0] == A
        assert struct.unpack_from("<Q", packed, sig7)[0] == (A + 4096 * 7 if W == 8 else A)


def test_built_cubin_through_fake_cuda(built):
    m = load_manifest(built, "sm_90")
    va = m.find("vector_add", T="bf16")
    pcuda.clear_caches()
    drv = FakeDriver(param_layout={va.symbol: [(a.offset, a.size) for a in va.args]})
    with pcuda.use_driver(drv):
        k = pcuda.CudaLoader(m, device=0, mode="buffer").load(va)
        k.launch(3, {"a": A, "b": B, "out": OUT, va.args[3].name: 700}, stream=0)
    pcuda.clear_caches()
    rec = drv.launches[0]
    assert rec["block"] == (va.block_size, 1, 1) and rec["extra"][1] == struct.pack(
        "<QQQi", A, B, OUT, 700)
    image = [c[1] for c in drv.calls if c[0] == "cuModuleLoadData"][0]
    assert image[:4] == b"\x7fELF" and image == va.code_object()


def test_built_hsaco_through_fake_hip(built):
    m = load_manifest(built, "gfx1250")
    va = m.find("vector_add", T="f16")
    phip.clear_caches()
    h = FakeHip()
    with phip.use_hip(h):
        phip.HipLoader(m, device=0).load(va).launch(
            5, {"a": A, "b": B, "out": OUT, va.args[3].name: 9}, stream=7)
    phip.clear_caches()
    rec = h.launches[0]
    assert rec["kernargs"][:28] == struct.pack("<QQQi", A, B, OUT, 9)
    assert len(rec["kernargs"]) == va.kernarg_size and rec["grid"] == (5, 1, 1)
