"""Dry run of scripts/gpu_proof_loader.py on CPU: a fake driver *executes* the kernels on
host memory (CPU tensors stand in for device buffers), so the script's plumbing (argument
names, packing, grids, rank protocol, result checks, JSON) is tested before the one GPU run,
and the checks are shown to fail when a kernel misbehaves.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch

from peerdsl import layout
from peerdsl.runtime import cuda as pcuda
from peerdsl.runtime import kernarg, packplan
from peerdsl.runtime.manifest import load_manifest
from test_runtime_loader_cuda import FakeDriver
from test_runtime_loader_helpers import fake_elf, kernel_entry, write_manifest

VA_ARGS = [{"name": n, "type": t, "offset": o, "size": s} for n, t, o, s in (
    ("a", "ptr<bf16>", 0, 8), ("b", "ptr<bf16>", 8, 8), ("out", "ptr<bf16>", 16, 8),
    ("n_packs", "i32", 24, 4))]
BP_ARGS = ([{"name": f"{t}_{i}", "type": "ptr<i32>", "offset": 64 * j + 8 * i, "size": 8}
            for j, t in enumerate(("sig", "slots")) for i in range(8)]
           + [{"name": n, "type": t, "offset": o, "size": s} for n, t, o, s in (
               ("counter", "ptr<i32>", 128, 8), ("out", "ptr<i32>", 136, 8),
               ("rank", "i32", 144, 4), ("counter_target", "i32", 148, 4),
               ("stamp", "i32", 152, 4))])


def host(addr: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """A writable view of n elements of host memory at addr (our stand-in device memory)."""
    item = torch.empty((), dtype=dtype).element_size()
    return torch.frombuffer((ctypes.c_char * (n * item)).from_address(addr), dtype=dtype)


class ExecDriver(FakeDriver):
    """Runs vector_add at launch and barrier_probe rounds at sync, on host memory."""

    def __init__(self, entries, bug=None):
        super().__init__(param_layout={e.symbol: [(a.offset, a.size) for a in e.args]
                                       for e in entries})
        self.entries = {e.symbol: e for e in entries}
        self.bug = bug
        self.pending: list[tuple] = []

    def cuDriverGetVersion(self):
        return 0, 13000

    def cuModuleGetFunction(self, module, name):
        err, f = super().cuModuleGetFunction(module, name)
        f.sizes = [a.size for a in self.entries[f.symbol].args]
        return err, f

    def cuLaunchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        res = super().cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra)
        e = self.entries[f.symbol]
        rec = self.launches[-1]
        if rec["extra"]:
            data = rec["extra"][1]
        else:
            buf = bytearray(e.kernarg_size)
            for a, raw in zip(e.args, rec["params"]):
                buf[a.offset:a.offset + a.size] = raw
            data = bytes(buf)
        args = kernarg.unpack_args(e.args, data)
        if e.op == "vector_add":
            self._vector_add(e, args, gx * bx)
        else:
            self.pending.append((e, args, gx))
        return res

    def _vector_add(self, e, v, threads):
        dt = {"bf16": torch.bfloat16, "f16": torch.float16}[e.constexprs["T"]]
        n = v["n_packs"] if not e.symbol.startswith("peerdsl_ref") else min(v["n_packs"],
                                                                              threads)
        a, b, out = (host(v[k], 8 * n, dt) for k in ("a", "b", "out"))
        out.copy_((a.float() + b.float()).to(dt))
        if self.bug == "vector_add" and n > 300:
            out.view(torch.int16)[300] ^= 1

    def flush(self, *_):
        rounds: dict[int, list] = {}
        for e, v, grid in self.pending:
            rounds.setdefault(v["stamp"], []).append((e, v, grid))
        self.pending.clear()
        for launches in rounds.values():
            W = int(launches[0][0].constexprs["W"])
            grid = launches[0][2]
            v0 = launches[0][1]
            counter = host(v0["counter"], 1, torch.int32)
            counter += len(launches) * grid
            complete = len(launches) == W and self.bug != "barrier"
            for _e, v, _g in launches:
                r = v["rank"]
                host(v[f"slots_{r}"], grid, torch.int32)[:] = v["stamp"] * 16 + r
            for _e, v, _g in launches:
                r = v["rank"]
                out = host(v["out"], 2 * grid, torch.int32).view(grid, 2)
                ok = int(counter.item()) >= v["counter_target"]
                for blk in range(grid):
                    seen = sum(int(host(v[f"slots_{q}"], grid, torch.int32)[blk].item())
                               == v["stamp"] * 16 + q for q in range(W))
                    out[blk, 0] = int(ok and complete)
                    out[blk, 1] = seen if complete else min(seen, W - 1)
                if not complete:
                    err = host(v[f"sig_{r}"] + 4 * layout.SIG_ERROR, 8, torch.int32)
                    err[:6] = torch.tensor([1, r, 0, layout.WAIT_FLAG, v["counter_target"],
                                            int(counter.item())])


@pytest.fixture
def proof(monkeypatch):
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_proof_loader.py"
    spec = importlib.util.spec_from_file_location("gpu_proof_loader_dry", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.DEVICE = "cpu"
    mod.RESULTS.clear()
    # CPU tensors pass as "device" buffers here only: the real check refuses them.
    real = packplan._pointer_value
    monkeypatch.setattr(packplan, "_pointer_value", lambda name, t, v, dev: real(
        name, t, v.data_ptr() if isinstance(v, torch.Tensor) else v, dev))
    streams = iter(range(0x100, 0x10000))
    cuda_ns = types.SimpleNamespace(
        is_available=lambda: True, set_device=lambda d: None, current_device=lambda: 0,
        get_device_name=lambda d=0: "fake sm_90", get_device_capability=lambda d=0: (9, 0),
        current_stream=lambda d=None: types.SimpleNamespace(cuda_stream=0),
        Stream=lambda: types.SimpleNamespace(cuda_stream=next(streams)),
        synchronize=lambda: None)
    monkeypatch.setattr(mod.torch, "cuda", cuda_ns)
    pcuda.clear_caches()
    yield mod
    pcuda.clear_caches()


def _manifest(tmp_path):
    kernels = {}
    d = tmp_path / "sm_90"
    d.mkdir(parents=True)
    for name, op, args, size, cx in (
            ("vector_add_bf", "vector_add", VA_ARGS, 28, {"T": "bf16"}),
            ("vector_add_h", "vector_add",
             [dict(a, type=a["type"].replace("bf16", "f16")) for a in VA_ARGS], 28, {"T": "f16"}),
            ("barrier_probe_2", "barrier_probe", BP_ARGS, 156, {"W": 2}),
            ("barrier_probe_4", "barrier_probe", BP_ARGS, 156, {"W": 4})):
        data = fake_elf("sm_90", name.encode())
        (d / f"{name}.cubin").write_bytes(data)
        kernels[name] = kernel_entry(name, op, args, size, cx, data, "cubin")
        kernels[name]["block_size"] = 256 if op == "vector_add" else 64
    write_manifest(tmp_path, "sm_90", kernels)
    return load_manifest(tmp_path, "sm_90")


def _run(proof, tmp_path, monkeypatch, bug=None):
    man = _manifest(tmp_path / "build")
    ref = load_manifest(proof.builtin_manifest(tmp_path / "ref"), "sm_90")
    drv = ExecDriver(list(man.kernels.values()) + list(ref.kernels.values()), bug=bug)
    bindings = types.ModuleType("cuda.bindings")
    bindings.driver, bindings.__version__ = drv, "fake"
    cuda_pkg = types.ModuleType("cuda")
    cuda_pkg.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda_pkg)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.driver", drv)
    monkeypatch.setattr(proof, "sync", drv.flush)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.setattr(sys, "argv", ["gpu_proof_loader.py", "--manifest",
                                      str(tmp_path / "build"), "--rounds", "6", "--no-ipc"])
    with pcuda.use_driver(drv):
        rc = proof.main()
    doc = json.loads((tmp_path / "out" / "loader_proof.json").read_text())
    return rc, {c["name"]: c for c in doc["checks"]}, drv


def test_proof_dry_run_passes(proof, tmp_path, monkeypatch):
    rc, checks, drv = _run(proof, tmp_path, monkeypatch)
    assert rc == 0, {k: c["detail"] for k, c in checks.items() if not c["ok"]}
    assert set(checks) == {
        "environment", "builtin_vector_add[params]", "builtin_vector_add[buffer]",
        "load_manifest", "vector_add[bf16,params]", "vector_add[bf16,buffer]",
        "vector_add[f16,params]", "vector_add[f16,buffer]", "barrier_probe[W=2]",
        "barrier_probe[W=4]", "barrier_timeout", "no_mlir"}
    grids = {rec["grid"][0] for rec in drv.launches if rec["block"] == (64, 1, 1)}
    assert grids == {1, 2, 3, 4, 16}
    assert {rec["stream"] for rec in drv.launches if rec["block"] == (64, 1, 1)} != {0}


@pytest.mark.parametrize("bug, failing", [
    ("vector_add", {"vector_add[bf16,params]", "vector_add[f16,buffer]"}),
    ("barrier", {"barrier_probe[W=2]", "barrier_probe[W=4]"}),
])
def test_proof_catches_wrong_results(proof, tmp_path, monkeypatch, bug, failing):
    rc, checks, _ = _run(proof, tmp_path, monkeypatch, bug=bug)
    assert rc == 1
    bad = {k for k, c in checks.items() if not c["ok"]}
    assert failing <= bad
    assert "builtin_vector_add[params]" in bad or bug != "vector_add"
