"""`peerdsl build --module`: user ops built beside the shipped ones, the manifest merged (never
clobbered), provenance per entry, and bad input that exits 2 and writes nothing."""
from __future__ import annotations

import hashlib
import json
import os
import sys
import textwrap

import pytest

import peerdsl
from peerdsl import cli
from peerdsl.lowering import build as B
from peerdsl.ops import registry

ARCH = "gfx1250"

USER_OPS = '''
import peerdsl
import peerdsl.dsl as dsl


@dsl.kernel(block_size=64)
def user_scale(x: dsl.Ptr["T"], out: dsl.Ptr["T"], n: dsl.i32, K: dsl.constexpr,
               T: dsl.constexpr):
    i = dsl.block_id() * dsl.block_size() + dsl.thread_id()
    if i < n:
        out[i] = (x[i].to_f32() * float(K)).to(T)


peerdsl.register_op("user_scale", user_scale, {variants})
'''
FIRST = '[{"K": 2, "T": dsl.bf16}, {"K": 2, "T": dsl.f16}]'
SECOND = 'lambda target: [{"K": 2, "T": dsl.f16}]'  # bf16 dropped, the kernel unchanged


@pytest.fixture(scope="module")
def cache_env():
    """One compile cache for the module: each variant compiles once across the tests."""
    import tempfile
    with tempfile.TemporaryDirectory(prefix="peerdsl-user-build-") as d, \
            pytest.MonkeyPatch.context() as mp:
        mp.setenv("PEERDSL_CACHE_DIR", d)
        yield d


@pytest.fixture
def clean_registry():
    """User ops registered by a test are gone after it (other tests build 'all ops')."""
    registry.load_all()
    saved, mods = dict(registry.REGISTRY), set(sys.modules)
    yield
    registry.REGISTRY.clear()
    registry.REGISTRY.update(saved)
    registry._IMPORTED.clear()
    for m in set(sys.modules) - mods:
        del sys.modules[m]


def write_module(path, variants=FIRST, body=USER_OPS):
    path.write_text(textwrap.dedent(body.format(variants=variants)))
    return str(path)


def manifest(out):
    return json.loads((out / ARCH / "manifest.json").read_text())


def snapshot(out):
    """Every file under OUT with its bytes: what 'nothing was written' compares."""
    return {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture
def shipped_dir(tmp_path, cache_env, clean_registry):
    out = tmp_path / "out"
    assert cli.main(["build", "--arch", ARCH, "--ops", "vector_add", "-o", str(out), "-q"]) == 0
    return out


def test_user_module_merged_beside_shipped_ops(tmp_path, shipped_dir, capsys):
    before = manifest(shipped_dir)["kernels"]
    mod = write_module(tmp_path / "my_ops.py")
    rc = cli.main(["build", "--arch", ARCH, "--module", mod, "--ops", "user_scale",
                   "-o", str(shipped_dir), "-q"])
    assert rc == 0, capsys.readouterr().err
    assert "2 kernels, 2 kept from other ops" in capsys.readouterr().out
    kernels = manifest(shipped_dir)["kernels"]
    assert {n: k for n, k in kernels.items() if k["op"] == "vector_add"} == before
    user = [k for k in kernels.values() if k["op"] == "user_scale"]
    assert sorted(k["constexprs"]["T"] for k in user) == ["bf16", "f16"]
    sha = hashlib.sha256(open(mod, "rb").read()).hexdigest()
    for k in user:
        assert k["provenance"]["module"] == "my_ops"
        assert k["provenance"]["source"] == mod
        assert k["provenance"]["source_sha256"] == sha
        assert k["provenance"]["compiler"]["llvm"]
        assert (shipped_dir / ARCH / k["file"]).is_file()
    # the runtime loads the merged manifest (it ignores the provenance field)
    from peerdsl.runtime.manifest import load_manifest
    m = load_manifest(shipped_dir, ARCH, verify=True)
    assert m.ops() == ["user_scale", "vector_add"]
    e = m.find("user_scale", T="f16")
    assert [a.name for a in e.args] == ["x", "out", "n"] and e.block_size == 64


def test_rebuilding_an_op_replaces_its_stale_entries(tmp_path, shipped_dir, capsys):
    mod = write_module(tmp_path / "my_ops.py")
    assert cli.main(["build", "--arch", ARCH, "--module", mod, "--ops", "user_scale",
                     "-o", str(shipped_dir), "-q"]) == 0
    old = {n: k for n, k in manifest(shipped_dir)["kernels"].items() if k["op"] == "user_scale"}
    stale = [k for k in old.values() if k["constexprs"]["T"] == "bf16"][0]
    write_module(tmp_path / "my_ops.py", SECOND)  # edited: the module is imported afresh
    assert cli.main(["build", "--arch", ARCH, "--module", mod, "--ops", "user_scale",
                     "-o", str(shipped_dir), "-q"]) == 0
    kernels = manifest(shipped_dir)["kernels"]
    user = {n: k for n, k in kernels.items() if k["op"] == "user_scale"}
    assert [k["constexprs"]["T"] for k in user.values()] == ["f16"]
    assert stale["symbol"] not in kernels
    assert not (shipped_dir / ARCH / stale["file"]).exists()
    assert not (shipped_dir / ARCH / stale["isa_file"]).exists()
    [f16] = user.values()
    assert f16["provenance"]["source_sha256"] == hashlib.sha256(open(mod, "rb").read()).hexdigest()
    assert f16["provenance"]["source_sha256"] != old[f16["symbol"]]["provenance"]["source_sha256"]
    assert sorted(k["op"] for k in kernels.values()).count("vector_add") == 2
    # a build of the shipped op alone keeps the user op's entry
    assert cli.main(["build", "--arch", ARCH, "--ops", "vector_add", "-o", str(shipped_dir),
                     "-q"]) == 0
    assert manifest(shipped_dir)["kernels"][f16["symbol"]] == f16


def test_dotted_module_and_api_build(tmp_path, cache_env, clean_registry, monkeypatch):
    pkg = tmp_path / "userpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    write_module(pkg / "ops.py", 'lambda target: [{"K": 3 if target.is_amd else 4, '
                                 '"T": dsl.bf16}]')
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert cli.main(["build", "--arch", ARCH, "--module", "userpkg.ops", "--ops", "user_scale",
                     "-o", str(out), "-q"]) == 0
    [k] = manifest(out)["kernels"].values()
    assert k["constexprs"] == {"K": 3, "T": "bf16"}  # the callable saw the AMD target
    assert k["provenance"]["module"] == "userpkg.ops"
    # the same through the Python API, into another directory
    m = B.build(ARCH, ["user_scale"], str(tmp_path / "api"))
    assert m["kernels"] == manifest(out)["kernels"]


def test_register_op_checks_its_input(clean_registry):
    from peerdsl.ops.vector_add import vector_add

    @peerdsl.kernel(block_size=32)
    def vector_add_twin(a: peerdsl.dsl.Ptr[peerdsl.dsl.f32]):
        a[0] = 1.0

    with pytest.raises(ValueError, match="'vector_add' registered twice"):
        peerdsl.register_op("vector_add", vector_add_twin, [{}])
    with pytest.raises(ValueError, match="list of constexpr dicts or a callable"):
        peerdsl.register_op("twin", vector_add_twin, {"T": 1})
    with pytest.raises(ValueError, match="variants must be dicts"):
        peerdsl.register_op("twin", vector_add_twin, [("T", 1)])
    with pytest.raises(ValueError, match="expected a @dsl.kernel"):
        peerdsl.register_op("twin", lambda: None, [{}])
    with pytest.raises(ValueError, match="must be an identifier"):
        peerdsl.register_op("two words", vector_add_twin, [{}])
    spec = peerdsl.register_op("twin", vector_add_twin, [{}])
    assert spec.registered_by == __name__ and spec.variants(None) == [{}]
    peerdsl.register_op("vector_add", vector_add, registry.REGISTRY["vector_add"].variants)


# ----------------------------------------------------------------------------- bad input

BROKEN_TRACE = '''
import peerdsl
import peerdsl.dsl as dsl


@dsl.kernel(block_size=64)
def user_broken(x: dsl.Ptr[dsl.bf16]):
    t = dsl.thread_id()
    x[t] = x[t] + x[t]  # bf16 arithmetic: refused by the numerics contract


peerdsl.register_op("user_broken", user_broken, [{}])
'''
RAISES_AT_IMPORT = '''
import peerdsl.dsl as dsl

VALUE = 1 // 0
'''


def _bad_cases(tmp_path):
    good = write_module(tmp_path / "good_ops.py")
    broken = tmp_path / "broken_ops.py"
    broken.write_text(BROKEN_TRACE)
    raises = tmp_path / "raises_ops.py"
    raises.write_text(RAISES_AT_IMPORT)
    missing = write_module(tmp_path / "missing_ops.py", '[{"T": dsl.bf16}]')
    nvfail = write_module(tmp_path / "nv_ops.py", 'lambda target: [{"K": 1, "T": dsl.bf16}] '
                          'if target.is_amd else [{"K": 1}]')
    return {
        "trace": (["--module", str(broken), "--ops", "user_broken"],
                  [f"{broken}:9", "bf16", "user_broken"]),
        "import": (["--module", str(raises), "--ops", "vector_add"],
                   [f"{raises}:4", "ZeroDivisionError"]),
        "missing constexpr": (["--module", missing, "--ops", "user_scale"],
                              ["missing constexpr K", "['K', 'T']"]),
        "second arch fails": (["--module", nvfail, "--ops", "user_scale", "--arch", "sm_90"],
                              ["missing constexpr T", "sm_90"]),
        "unknown op": (["--module", good, "--ops", "user_scale,nope"],
                       ["unknown ops ['nope']", "user_scale"]),
        "unknown arch": (["--ops", "vector_add", "--arch", "gfx9000"],
                         ["gfx9000", "supported: gfx1250"]),
        "no such file": (["--module", str(tmp_path / "absent.py")], ["no such file"]),
        "no such module": (["--module", "no_such_pkg.ops"], ["no module named 'no_such_pkg'"]),
    }


@pytest.mark.parametrize("case", ["trace", "import", "missing constexpr", "second arch fails",
                                  "unknown op", "unknown arch", "no such file",
                                  "no such module"])
def test_bad_input_exits_2_and_writes_nothing(case, tmp_path, shipped_dir, capsys):
    argv, expected = _bad_cases(tmp_path)[case]
    before = snapshot(shipped_dir)
    registered = set(registry.REGISTRY)
    rc = cli.main(["build", "--arch", ARCH, *argv, "-o", str(shipped_dir), "-q"])
    err = capsys.readouterr().err
    assert rc == 2, err
    for text in expected:
        assert text in err, (text, err)
    assert "nothing was written" in err
    assert snapshot(shipped_dir) == before
    if case == "import":
        assert set(registry.REGISTRY) == registered


def test_an_instance_clashing_with_another_ops_entry_is_refused(tmp_path, shipped_dir, capsys):
    """A user kernel named like a shipped one, with the same constexprs, has the same
    instance symbol: building it beside the shipped op would overwrite its code object."""
    mod = tmp_path / "clash_ops.py"
    mod.write_text(textwrap.dedent('''
        import peerdsl
        import peerdsl.dsl as dsl

        @dsl.kernel(block_size=64)
        def vector_add(a: dsl.Ptr["T"], T: dsl.constexpr):
            a[dsl.thread_id()] = a[dsl.thread_id()]

        peerdsl.register_op("my_add", vector_add, [{"T": dsl.bf16}])
    '''))
    before = snapshot(shipped_dir)
    assert cli.main(["build", "--arch", ARCH, "--module", str(mod), "--ops", "my_add",
                     "-o", str(shipped_dir), "-q"]) == 2
    err = capsys.readouterr().err
    assert "already in" in err and "'vector_add'" in err and "rename" in err
    assert snapshot(shipped_dir) == before


def test_a_damaged_manifest_is_not_clobbered(tmp_path, cache_env, clean_registry, capsys):
    out = tmp_path / "out"
    (out / ARCH).mkdir(parents=True)
    (out / ARCH / "manifest.json").write_text("{not json")
    assert cli.main(["build", "--arch", ARCH, "--ops", "vector_add", "-o", str(out), "-q"]) == 2
    assert "cannot be read" in capsys.readouterr().err
    assert os.listdir(out / ARCH) == ["manifest.json"]


def test_without_ops_the_user_ops_join_the_shipped_ones(tmp_path, clean_registry):
    from peerdsl.lowering.targets import get_target
    registry.import_module(write_module(tmp_path / "my_ops.py"))
    ops = {op for op, _k, _cx in registry.build_items(get_target(ARCH))}
    assert {"user_scale", "vector_add", "allreduce_ll", "fused_ar_rms_1stage"} <= ops


def test_a_compiler_failure_exits_1_and_writes_nothing(tmp_path, shipped_dir, capsys,
                                                       monkeypatch):
    from peerdsl.lowering.errors import CompileError
    real = B.compile_cached

    def failing(op, kernel, constexprs, *a, **kw):
        if str(constexprs.get("T")) == "f16":
            raise CompileError("LLVM said no")
        return real(op, kernel, constexprs, *a, **kw)

    monkeypatch.setattr(B, "compile_cached", failing)
    before = snapshot(shipped_dir)
    mod = write_module(tmp_path / "my_ops.py")
    assert cli.main(["build", "--arch", ARCH, "--module", mod, "--ops", "user_scale",
                     "-o", str(shipped_dir), "-q"]) == 1
    err = capsys.readouterr().err
    assert "LLVM said no" in err and "nothing was written" in err
    assert snapshot(shipped_dir) == before
