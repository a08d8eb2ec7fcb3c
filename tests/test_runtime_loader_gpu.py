"""The CUDA loader on a real GPU (sm_90): skipped with a reason where there is none.

Uses the proof script's checks: the hand-written PTX vector_add always; the built manifest's
vector_add and barrier_probe when PEERDSL_MANIFEST_DIR points at a build dir.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def _why_not() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    if torch.version.cuda is None:
        return "torch is not a CUDA build"
    try:
        importlib.import_module("cuda.bindings.driver")
    except ImportError:
        return "cuda-bindings is not installed (`from cuda.bindings import driver` fails)"
    if torch.cuda.get_device_capability() < (9, 0):
        return "needs sm_90 or newer for the sm_90 cubins"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_why_not() is not None,
                                                  reason=str(_why_not()))]


@pytest.fixture(scope="module")
def proof():
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_proof_loader.py"
    spec = importlib.util.spec_from_file_location("gpu_proof_loader", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("mode", ["params", "buffer"])
def test_builtin_vector_add(proof, tmp_path, mode):
    from peerdsl.runtime import cuda as pcuda
    from peerdsl.runtime.manifest import load_manifest
    man = load_manifest(proof.builtin_manifest(tmp_path), "sm_90")
    e = man.find("vector_add", T="bf16")
    k = pcuda.CudaLoader(man, mode=mode).load(e)
    assert "bit-exact" in proof.run_vector_add(k, e, torch.bfloat16, mode)


@pytest.mark.skipif(not os.environ.get("PEERDSL_MANIFEST_DIR"),
                    reason="PEERDSL_MANIFEST_DIR (a build dir with sm_90/manifest.json) not set")
def test_manifest_kernels(proof):
    from peerdsl.runtime.manifest import load_manifest
    proof.RESULTS.clear()
    proof.manifest_checks(load_manifest(os.environ["PEERDSL_MANIFEST_DIR"], "sm_90"),
                          torch.cuda.current_device(), rounds=5)
    failed = [r for r in proof.RESULTS if not r["ok"]]
    assert proof.RESULTS and not failed, failed


def test_ipc_two_processes():
    from peerdsl.runtime.cuda import selftest
    assert "parent saw its writes" in selftest.run_ipc_selftest(torch.cuda.current_device())


def test_vmm_fd_two_processes():
    from peerdsl.runtime.cuda import selftest
    assert "parent saw its 9s" in selftest.run_vmm_selftest(torch.cuda.current_device())
