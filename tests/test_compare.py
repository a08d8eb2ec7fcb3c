"""`peerdsl compare` static: any op (shipped or a user's) beside any HIP file.

The end-to-end tests need clang-22 (the reference build; .ci/run installs it) and the MLIR
bindings (the DSL build); they skip, saying which, when either is missing. sm_90 needs nvcc.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from peerdsl import cli
from peerdsl import compare_sides as cs
from peerdsl import reference_build as rb
from peerdsl.compare_run import CompareError

REPO = Path(__file__).resolve().parent.parent


def _need(arch: str = "gfx1250") -> None:
    why = rb.missing_reason(arch)
    if why:
        pytest.skip(f"HIP reference not buildable here: {why}")
    if importlib.util.find_spec("flydsl") is None:
        pytest.skip("DSL build needs the MLIR bindings (pip install flydsl==0.5.0)")


def _row(out: str, label: str) -> tuple[int, int]:
    """The DSL and reference numbers of one table row (both must be ints)."""
    m = re.search(rf"^{re.escape(label)}\s+(-?\d+)\s+(-?\d+)(\s+[+-]\d+)?\s*$", out, re.M)
    assert m, f"no integer row {label!r} in:\n{out}"
    return int(m.group(1)), int(m.group(2))


def _compare(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["compare", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# ----------------------------------------------------------------------------- headers
def test_reference_layout_defaults_match_layout_py():
    """ref_common.h's fallback constants (a hand build) must equal layout.py's."""
    text = (rb.INCLUDE_DIR / "ref_common.h").read_text()
    for d in rb.layout_defines():
        name, value = d[2:].split("=")
        m = re.search(rf"#define {name} (\d+)", text)
        assert m and int(m.group(1)) == int(value), name


def test_headers_ship_once_inside_the_package():
    for h in ("ref_common.h", "hip_min.h", "hip_to_cuda.h"):
        copies = [p for p in REPO.rglob(h) if ".git" not in p.parts and "build" not in p.parts]
        assert copies == [rb.INCLUDE_DIR / h], copies
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"reference/include/*.h"' in pyproject  # package data: installs carry them


USER_HIP = """\
#include "ref_common.h"
// out = x * factor over 16-byte bf16 packs (the user op below, written by hand)
extern "C" __global__ REF_LAUNCH_BOUNDS(256) void user_scale_bf16(
    const hip_bfloat16* x, hip_bfloat16* out, int n_packs, float factor) {
  for (int i = ref_block_id() * 256 + ref_thread_id(); i < n_packs;
       i += ref_num_blocks(256) * 256) {
    F8 f = unpack(((const gvec*)x)[i]);
    for (int j = 0; j < 8; ++j) f.v[j] = f.v[j] * factor;
    ((gvec*)out)[i] = pack_rne(f);
  }
}
"""

USER_MODULE = """\
from peerdsl import dsl
from peerdsl.dsl import Ptr, constexpr
from peerdsl.ops.registry import register


@dsl.kernel(block_size=256)
def user_scale(x: Ptr["T"], out: Ptr["T"], n_packs: dsl.i32, factor: dsl.f32, T: constexpr):
    P = dsl.vec16(T)
    px, po = x.cast(P), out.cast(P)
    for i in range(dsl.block_id() * 256 + dsl.thread_id(), n_packs, dsl.num_blocks() * 256):
        po[i] = dsl.pack_rne([v * factor for v in px[i].to_f32()], T)


register("user_scale", user_scale, lambda target: [{"T": dsl.bf16}, {"T": dsl.f16}])
"""


@pytest.fixture
def user_files(tmp_path):
    """A user's op module and hand-written .hip in a directory of their own; the op leaves
    the registry afterwards (each test imports the module afresh, as each CLI run does)."""
    from peerdsl.ops.registry import REGISTRY
    (tmp_path / "user_ops.py").write_text(USER_MODULE)
    (tmp_path / "scale.hip").write_text(USER_HIP)
    yield tmp_path
    REGISTRY.pop("user_scale", None)


def test_out_of_tree_hip_builds_without_cpath(user_files, monkeypatch):
    if rb.find_clang() is None:
        pytest.skip(rb.missing_reason("gfx1250"))
    monkeypatch.delenv("CPATH", raising=False)
    for arch in ("gfx1250", "gfx942"):
        art = rb.build(user_files / "scale.hip", arch, user_files / "ref")
        assert art.code_object.read_bytes()[:4] == b"\x7fELF"
        assert "user_scale_bf16" in art.isa.read_text()


# ----------------------------------------------------------------------------- end to end
@pytest.mark.parametrize("op", ["fused_ar_rms_1stage", "allreduce_ll"])
def test_compare_shipped_op_gfx1250(op, tmp_path, capsys):
    _need()
    assert cli.main(["build", "--arch", "gfx1250", "--ops", op, "-o", str(tmp_path / "dsl"),
                     "-q"]) == 0
    capsys.readouterr()
    rc, out, err = _compare(capsys, op, "--arch", "gfx1250", "--build", str(tmp_path / "dsl"),
                            "--ref-build", str(tmp_path / "ref"))
    assert rc == 0, err
    want = "fused_ar_rms_1stage_bf16_h6144_w4" if op == "fused_ar_rms_1stage" else \
        "allreduce_ll_bf16_w4"  # the recipe's default variant, picked by name
    assert re.search(rf"^kernel\s+{op}_[0-9a-f]{{10}}\s+{want}\s*$", out, re.M), out
    assert f"manifest {tmp_path / 'dsl'}" in out  # from the manifest, not compiled again
    for label in ("VGPRs", "AGPRs", "SGPRs", "LDS bytes", "scratch bytes", "VGPR spills",
                  "occupancy (waves/SIMD)", "code bytes", "instructions", "waits",
                  "barriers", "VALU (v_*)", "SALU (s_*)"):
        _row(out, label)
    vgpr_dsl, vgpr_ref = _row(out, "VGPRs")
    assert 0 < vgpr_dsl <= 256 and 0 < vgpr_ref <= 256
    occ = _row(out, "occupancy (waves/SIMD)")
    assert all(1 <= o <= 16 for o in occ)
    assert all(n > 0 for n in _row(out, "  global_load_b128"))  # real 16-byte traffic
    assert all(n > 0 for n in _row(out, "  global_store_b128"))
    assert all(n > 0 for n in _row(out, "  s_wait_loadcnt"))
    assert all(n > 0 for n in _row(out, "atomics"))
    # the reference build is idempotent: a second build leaves the code object alone
    art = rb.build_amd(rb.REF_DIR / f"{op}.hip", "gfx1250", tmp_path / "ref")
    mtime = art.code_object.stat().st_mtime_ns
    assert rb.build_amd(rb.REF_DIR / f"{op}.hip", "gfx1250", tmp_path / "ref").code_object \
        .stat().st_mtime_ns == mtime


def test_compare_user_op_with_user_hip_through_the_cache(user_files, tmp_path, capsys):
    """Any op, any HIP file: a user module's op, no manifest, a hand-written .hip."""
    _need()
    args = ["user_scale", "--module", str(user_files / "user_ops.py"), "--ref",
            str(user_files / "scale.hip"), "--arch", "gfx1250", "-c", "T=bf16",
            "--build", str(tmp_path / "nothing"), "--ref-build", str(tmp_path / "ref")]
    rc, out, err = _compare(capsys, *args)
    assert rc == 0, err
    assert "kernel user_scale_bf16: the only kernel in the file" in out
    assert "compiled through the build cache" in out
    assert f"peerdsl build --arch gfx1250 --module {user_files / 'user_ops.py'} --ops " \
           f"user_scale -o {tmp_path / 'nothing'}" in out
    assert re.search(r"^kernel\s+user_scale_[0-9a-f]{10}\s+user_scale_bf16\s*$", out, re.M)
    assert _row(out, "  global_load_b128") == (1, 1)  # one 16-byte load per pack, each side
    assert _row(out, "  global_store_b128") == (1, 1)
    assert _row(out, "atomics") == (0, 0) and _row(out, "LDS bytes") == (0, 0)
    assert all(v > 0 for v in _row(out, "VGPRs"))
    assert _row(out, "kernarg bytes")[0] == 24  # x, out, n_packs, factor
    # a second run finds the variant in the cache; --markdown gives a table
    rc, out2, _ = _compare(capsys, *args, "--markdown", "--ref-symbol", "user_scale_{T}")
    assert rc == 0 and "cache hit" in out2 and "| VGPRs |" in out2


def test_compare_sm90_static(tmp_path, capsys):
    _need("sm_90")
    rc, out, err = _compare(capsys, "allreduce_ll", "--arch", "sm_90", "--build",
                            str(tmp_path / "none"), "--ref-build", str(tmp_path / "ref"))
    assert rc == 0, err
    assert all(0 < r <= 255 for r in _row(out, "registers"))
    assert all(n > 0 for n in _row(out, "  ld.global.b128"))
    dsl_bytes, ref_bytes = _row(out, "param bytes")
    assert dsl_bytes == ref_bytes + 4  # the same signature plus the DSL's dsl.CallId (i32)
    assert all(n > 0 for n in _row(out, "code bytes (SASS)"))


# ----------------------------------------------------------------------------- errors
def test_missing_build_without_mlir_says_how_to_build(tmp_path, capsys, monkeypatch):
    if rb.find_clang() is None:
        pytest.skip(rb.missing_reason("gfx1250"))
    from peerdsl.lowering import build

    def no_mlir(*a, **k):
        raise ModuleNotFoundError("No module named 'flydsl'")
    monkeypatch.setattr(build, "compile_cached", no_mlir)  # a machine without the bindings
    rc, out, err = _compare(capsys, "allreduce_ll", "--arch", "gfx1250", "--build",
                            str(tmp_path / "b"), "--ref-build", str(tmp_path / "ref"))
    assert rc == 2
    assert f"manifest path does not exist: {tmp_path / 'b'}" in err
    assert f"peerdsl build --arch gfx1250 [--module FILE_OR_MODULE] --ops allreduce_ll -o " \
           f"{tmp_path / 'b'}" in err
    assert not (tmp_path / "ref").exists()  # nothing written


def test_bad_inputs_are_named(user_files, tmp_path, capsys):
    if rb.find_clang() is None:
        pytest.skip(rb.missing_reason("gfx1250"))
    base = ["--arch", "gfx1250", "--build", str(tmp_path / "b"), "--ref-build",
            str(tmp_path / "ref"), "--ref", str(user_files / "scale.hip")]
    rc, _, err = _compare(capsys, "no_such_op", *base)
    assert rc == 2 and "unknown op 'no_such_op'" in err and "--module" in err
    rc, _, err = _compare(capsys, "user_scale", "--module", str(user_files / "user_ops.py"),
                          *base)
    assert rc == 2 and "matches 2 variants of user_scale" in err  # T not given
    rc, _, err = _compare(capsys, "user_scale", "--module", str(user_files / "user_ops.py"),
                          "-c", "T=bf16,N=3", *base)
    assert rc == 2 and "unknown ['N']" in err
    bad = tmp_path / "bad_ops.py"
    bad.write_text("x = 1\nraise ValueError('broken on purpose')\n")
    rc, _, err = _compare(capsys, "user_scale", "--module", str(bad), *base)
    assert rc == 2 and f"importing {bad} failed at {bad}:2: ValueError: broken" in err
    rc, _, err = _compare(capsys, "allreduce_ll", "--arch", "gfx1250", "--run")
    assert rc == 2 and "--run needs --arch sm_90" in err
    rc, _, err = _compare(capsys, "vector_add", "--arch", "sm_90", "--run")
    assert rc == 2 and "--inputs MODULE:FUNCTION" in err
    rc, _, err = _compare(capsys, "allreduce_ll", "--arch", "gfx1250", "--ref",
                          str(tmp_path / "missing.hip"))
    assert rc == 2 and "no reference source" in err


def test_pick_ref_symbol_rules():
    names = ["fused_ar_rms_1stage_bf16_h4096_w4", "fused_ar_rms_1stage_bf16_h6144_w4",
             "fused_ar_rms_1stage_bf16_h6144_w8"]
    cx = {"T": "bf16", "H": 6144, "W": 4, "FP8": "e4m3fn"}
    assert cs.pick_ref_symbol(names, "fused_ar_rms_1stage", cx, None)[0] == names[1]
    assert cs.pick_ref_symbol(names, "x", cx, "fused_ar_rms_1stage_{T}_h{H}_w8")[0] == names[2]
    with pytest.raises(CompareError, match="not a kernel of the reference"):
        cs.pick_ref_symbol(names, "x", cx, "other")
    with pytest.raises(CompareError, match="pass --ref-symbol"):
        cs.pick_ref_symbol(names[1:], "fused_ar_rms_1stage", {"H": 6144}, None)
    assert cs.pick_ref_symbol(["a", "myop"], "myop", {}, None) == ("myop", "named as the op")


def test_parse_constexprs():
    assert cs.parse_constexprs(["H=6144", "T=bf16,W=4", "eps=1e-6", "FLAG=true"]) == {
        "H": 6144, "T": "bf16", "W": 4, "eps": 1e-6, "FLAG": True}
    with pytest.raises(CompareError, match="NAME=VALUE"):
        cs.parse_constexprs(["H"])


def test_missing_clang_is_a_clear_reason(monkeypatch, capsys):
    monkeypatch.setattr(rb, "find_clang", lambda: None)
    assert "clang-22" in rb.missing_reason("gfx1250")
    rc, _, err = _compare(capsys, "allreduce_ll", "--arch", "gfx1250")
    assert rc == 2 and "clang-22 is not installed" in err


def test_missing_nvcc_is_a_clear_reason(monkeypatch, capsys):
    monkeypatch.setattr(rb, "find_nvcc", lambda: None)
    rc, _, err = _compare(capsys, "allreduce_ll", "--arch", "sm_90")
    assert rc == 2 and "needs nvcc" in err


def test_shipped_build_script_uses_the_package_headers():
    script = (REPO / "reference" / "hip" / "build.sh").read_text()
    assert "python -m peerdsl.reference_build" in script
    flags = rb.include_flags(rb.REF_DIR / "allreduce_ll.hip")
    assert flags[-1] == f"-I{rb.INCLUDE_DIR}" and flags[0] == f"-I{rb.REF_DIR}"


def test_ambiguous_variant_in_a_manifest_asks_for_more_constexprs(user_files, tmp_path,
                                                                 capsys):
    _need()
    assert cli.main(["build", "--arch", "gfx1250", "--ops", "vector_add", "-o",
                     str(tmp_path / "dsl"), "-q"]) == 0
    capsys.readouterr()
    base = ["vector_add", "--arch", "gfx1250", "--build", str(tmp_path / "dsl"), "--ref",
            str(user_files / "scale.hip"), "--ref-build", str(tmp_path / "ref")]
    rc, _, err = _compare(capsys, *base)
    assert rc == 2 and "matches 2 built variants of vector_add" in err
    assert "--constexpr T=" in err
    rc, out, err = _compare(capsys, *base, "-c", "T=f16")
    assert rc == 0, err
    assert "vector_add on gfx1250 (T=f16)" in out and f"manifest {tmp_path / 'dsl'}" in out
