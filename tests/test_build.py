"""Ahead-of-time build: manifest format, the content-addressed cache, the CLI (CPU only)."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import textwrap

import pytest

import peerdsl.dsl as dsl
from peerdsl import cli
from peerdsl.lowering import build as B
from peerdsl.lowering.cache import Cache, cache_key

AMD_RES = {"vgpr", "sgpr", "scratch_bytes", "vgpr_spill", "sgpr_spill"}
NV_RES = {"registers", "spill_stores", "spill_loads", "stack_bytes"}


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("PEERDSL_CACHE_DIR", str(d))
    return d


@pytest.mark.parametrize("arch", ["gfx1250", "sm_90"])
def test_manifest_format(tmp_path, cache_dir, arch):
    out = tmp_path / "out"
    m = B.build(arch, ["vector_add", "barrier_probe"], str(out))
    doc = json.loads((out / arch / "manifest.json").read_text())
    assert doc == m
    assert set(doc) == {"arch", "vendor", "wave_size", "fp8_format", "compiler", "kernels"}
    assert doc["arch"] == arch and doc["wave_size"] == 32 and doc["fp8_format"] == "e4m3fn"
    assert doc["vendor"] == ("amd" if arch.startswith("gfx") else "nvidia")
    assert {"peerdsl", "flydsl", "llvm", "ptxas"} <= set(doc["compiler"])
    assert len(doc["kernels"]) == 2 + 3  # vector_add T in bf16, f16; barrier_probe W 2, 4, 8
    ext, isa_ext = ("hsaco", ".s") if arch.startswith("gfx") else ("cubin", ".ptx")
    for name, k in doc["kernels"].items():
        assert set(k) == {"op", "symbol", "file", "sha256", "isa_file", "constexprs",
                          "block_size", "lds_bytes", "args", "kernarg_size", "resources",
                          "cache_key", "provenance"}
        prov = k["provenance"]
        assert set(prov) == {"module", "source", "source_sha256", "compiler"}
        assert prov["module"] == f"peerdsl.ops.{k['op']}"
        assert prov["source"] == f"peerdsl/ops/{k['op']}.py"
        src = os.path.join(os.path.dirname(os.path.dirname(__file__)), prov["source"])
        assert prov["source_sha256"] == hashlib.sha256(open(src, "rb").read()).hexdigest()
        assert prov["compiler"] == doc["compiler"]
        assert k["symbol"] == name and k["file"] == f"{name}.{ext}"
        assert k["isa_file"] == f"{name}{isa_ext}" and (out / arch / k["isa_file"]).is_file()
        data = (out / arch / k["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == k["sha256"]
        assert set(k["resources"]) >= (AMD_RES if arch.startswith("gfx") else NV_RES)
        for a in k["args"]:  # the layout, and what the launch checks read (launch_args.py)
            assert {"name", "type", "offset", "size", "role"} <= set(a) <= {
                "name", "type", "offset", "size", "role", "param", "align", "elem"}
        assert k["kernarg_size"] >= k["args"][-1]["offset"] + k["args"][-1]["size"]
    vadd = [k for k in doc["kernels"].values() if k["op"] == "vector_add"]
    assert sorted(k["constexprs"]["T"] for k in vadd) == ["bf16", "f16"]  # dtypes by name
    assert [a["name"] for a in vadd[0]["args"]] == ["a", "b", "out", "n_packs"]
    assert [a["type"] for a in vadd[0]["args"]][-1] == "i32"
    probe = [k for k in doc["kernels"].values() if k["op"] == "barrier_probe"][0]
    names = [a["name"] for a in probe["args"]]
    assert names[:8] == [f"sig_{i}" for i in range(8)]  # peer tables: 8 consecutive pointers
    assert {(a["role"], a["param"], a["align"]) for a in probe["args"][:8]} == {
        ("peer_ptrs", "sig", 8)}  # 8-byte {epoch, tag} barrier slots
    assert probe["block_size"] == 64


def test_runtime_loads_the_manifest(tmp_path, cache_dir):
    from peerdsl.runtime.manifest import load_manifest
    B.build("gfx942", ["vector_add"], str(tmp_path))
    m = load_manifest(tmp_path, "gfx942")
    e = m.find("vector_add", T="f16")
    assert e.kernarg_size == 28 and e.block_size == 256
    assert m.fp8_format == "e4m3fnuz" and m.wave_size == 64


def test_cache_hit_miss_and_no_cache(tmp_path, cache_dir):
    seen = []
    B.build("sm_90", ["vector_add"], str(tmp_path / "a"), progress=seen.append)
    assert [r.cached for r in seen] == [False, False]
    seen.clear()
    m2 = B.build("sm_90", ["vector_add"], str(tmp_path / "b"), progress=seen.append)
    assert [r.cached for r in seen] == [True, True]
    assert all(r.seconds < 0.5 for r in seen)
    seen.clear()
    m3 = B.build("sm_90", ["vector_add"], str(tmp_path / "c"), use_cache=False,
                 progress=seen.append)
    assert [r.cached for r in seen] == [False, False]
    assert m2["kernels"] == m3["kernels"]  # same bytes compiled afresh: deterministic


def _module(path, body: str):
    path.write_text(textwrap.dedent(f'''
        import peerdsl.dsl as dsl

        def helper(x):
            {body}

        @dsl.kernel(block_size=64)
        def probe(a: dsl.Ptr[dsl.f32]):
            t = dsl.thread_id()
            a[t] = helper(a[t])
    '''))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cache_invalidated_when_a_helper_changes(tmp_path, cache_dir):
    v1 = _module(tmp_path / "k_v1.py", "return x * 2.0")
    v1b = _module(tmp_path / "k_v1b.py", "return x * 2.0")        # same source elsewhere
    v2 = _module(tmp_path / "k_v2.py", "return x * 3.0")          # helper body changed
    r1 = B.compile_cached("probe", v1.probe, {}, "gfx950")
    assert not r1.cached
    r1b = B.compile_cached("probe", v1b.probe, {}, "gfx950")
    assert r1b.cached and r1b.entry["cache_key"] == r1.entry["cache_key"]
    r2 = B.compile_cached("probe", v2.probe, {}, "gfx950")
    assert not r2.cached and r2.entry["cache_key"] != r1.entry["cache_key"]
    assert r2.entry["sha256"] != r1.entry["sha256"]


def test_cache_key_depends_on_target_and_constexprs():
    from peerdsl.ops.vector_add import vector_add
    from peerdsl.lowering.targets import get_target
    kb, kf = vector_add.trace(T=dsl.bf16), vector_add.trace(T=dsl.f16)
    keys = {cache_key(kb, "s", get_target("gfx1250")), cache_key(kb, "s", get_target("gfx950")),
            cache_key(kf, "s", get_target("gfx1250"))}
    assert len(keys) == 3


def test_damaged_cache_entry_is_recompiled(tmp_path, cache_dir):
    r1 = B.compile_cached("probe", _module(tmp_path / "k.py", "return x + 1.0").probe, {},
                          "sm_90")
    key = r1.entry["cache_key"]
    code = os.path.join(Cache()._dir(key), "code")
    with open(code, "ab") as f:
        f.write(b"junk")
    assert Cache().get(key) is None
    r2 = B.compile_cached("probe", _module(tmp_path / "k2.py", "return x + 1.0").probe, {},
                          "sm_90")
    assert not r2.cached and r2.entry["sha256"] == r1.entry["sha256"]


def test_cli_build(tmp_path, cache_dir, capsys):
    rc = cli.main(["build", "--arch", "gfx1250", "--ops", "vector_add", "-o", str(tmp_path),
                   "-q"])
    assert rc == 0 and (tmp_path / "gfx1250" / "manifest.json").is_file()
    assert "2 kernels" in capsys.readouterr().out
    rc = cli.main(["build", "--arch", "gfx1250", "--ops", "vector_add", "-o", str(tmp_path),
                   "--no-cache"])
    assert rc == 0
    assert cli.main(["build", "--arch", "gfx1"]) == 2
    assert "supported: gfx1250" in capsys.readouterr().err
    assert cli.main(["build", "--arch", "sm_90", "--ops", "nope", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unknown ops ['nope']" in err and "vector_add" in err and "nothing was written" in err
    assert not (tmp_path / "sm_90").exists()


def test_cli_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    assert "build" in capsys.readouterr().out
    assert "build" in cli.SUBCOMMANDS and callable(cli.subcommand)
