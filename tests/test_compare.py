"""`peerdsl compare`: instruction-class counting, and DSL vs the HIP reference on gfx1250.

The counting tests are pure text and always run. The end-to-end test needs clang-22 (the
reference build) and the MLIR bindings (the DSL build); it skips, saying which, when either
is missing (CI does not install clang-22).
"""
from __future__ import annotations

import importlib.util
import re

import pytest

from peerdsl import cli
from peerdsl import compare as C
from peerdsl import reference_build as rb

AMD_SNIPPET = """\
	.globl	k
k:                                      ; @k
	s_load_b256 s[4:11], s[0:1], 0x0
	s_wait_kmcnt 0x0
	global_load_b128 v[0:3], v4, s[4:5]
	global_load_b128 v[4:7], v4, s[6:7] scope:SCOPE_SYS
	global_load_b64 v[8:9], v4, s[8:9]
	global_load_b32 v10, v4, s[10:11] th:TH_LOAD_NT scope:SCOPE_SYS
	global_load_u16 v11, v4, s[10:11]
	s_wait_loadcnt 0x0
	global_store_b128 v4, v[0:3], s[4:5]
	global_store_b32 v4, v10, s[4:5] scope:SCOPE_SYS
	global_atomic_add_u32 v12, v4, v13, s[8:9] th:TH_ATOMIC_RETURN scope:SCOPE_SYS
	global_wb scope:SCOPE_SYS
	global_inv scope:SCOPE_SYS
	ds_store_b32 v4, v10
	s_barrier_signal -1
	s_barrier_wait -1
	s_cbranch_execz .LBB0_2
; %bb.1:
	s_branch .LBB0_2
.LBB0_2:                                ; comment only
	s_endpgm
.Lfunc_end0:
	.size	k, .Lfunc_end0-k
other:
	global_load_b128 v[0:3], v4, s[4:5]
"""


def test_count_amd_classes():
    c = C.count_amd(C.function_lines(AMD_SNIPPET, "k"))
    assert c["global load b128"] == 2 and c["global load b64"] == 1
    assert c["global load b32"] == 1 and c["global load other"] == 1
    assert c["global store b128"] == 1 and c["global store b32"] == 1
    assert c["atomics"] == 1 and c["cache wb/inv"] == 2 and c["LDS (ds_*)"] == 1
    assert c["waits (s_wait*)"] == 2 and c["barriers"] == 2 and c["branches"] == 2
    assert c["scalar loads"] == 1
    assert c["total"] == 19  # `other` is not part of k; labels and directives are not counted


def test_count_amd_objdump_form():
    text = ("0000000000001600 <k>:\n"
            "\tglobal_load_b128 v[0:3], v4, s[4:5]                        // 000000001600: EE\n"
            "\ts_endpgm                                                   // 000000001608: BF\n"
            "0000000000001700 <next>:\n\ts_endpgm\n")
    c = C.count_amd(C.function_lines(text, "k"))
    assert c["global load b128"] == 1 and c["total"] == 2


PTX_SNIPPET = """\
.visible .entry k(
	.param .u64 k_param_0
)
{
	ld.param.u64 	%rd1, [k_param_0];
	ld.global.v4.u32 	{%r1, %r2, %r3, %r4}, [%rd1];
	ld.acquire.sys.b32 %r5,[%rd1];
	ld.volatile.global.v4.b32 {%r1,%r2,%r3,%r4}, [%rd1];
	st.global.v4.u32 	[%rd1], {%r1, %r2, %r3, %r4};
	st.release.sys.b32 	[%rd1], %r5;
	{  cvt.rn.bf16.f32 %rs9, %f35;}
	atom.cas.acq_rel.sys.b32 %r6, [%rd1], 0, 1;
	ld.shared.f32 %f1, [%r7];
	bar.sync 	0;
	@%p1 bra 	$L__BB0_2;
$L__BB0_2:
	ret;
}
"""


def test_count_ptx_classes():
    c = C.count_ptx(C.ptx_function(PTX_SNIPPET, "k"))
    assert c["global load b128"] == 2 and c["global load b32"] == 1
    assert c["global store b128"] == 1 and c["global store b32"] == 1
    assert c["atomics"] == 1 and c["LDS (ds_*)"] == 1 and c["barriers"] == 1
    assert c["branches"] == 1
    assert c["total"] == 12  # ld.param counts as an instruction, not as a global load


def test_reference_layout_defaults_match_layout_py():
    """ref_common.h's fallback constants (a hand build) must equal layout.py's."""
    text = (rb.REF_DIR / "ref_common.h").read_text()
    for d in rb.layout_defines():
        name, value = d[2:].split("=")
        m = re.search(rf"#define {name} (\d+)", text)
        assert m and int(m.group(1)) == int(value), name


def test_ref_symbols():
    assert C.ref_symbol("fused_ar_rms_1stage", "bf16", 6144, 4) == \
        "fused_ar_rms_1stage_bf16_h6144_w4"
    assert C.ref_symbol("allreduce_ll", "bf16", 6144, 8) == "allreduce_ll_bf16_w8"


def _need_tools() -> None:
    why = rb.missing_reason("gfx1250")
    if why:
        pytest.skip(f"HIP reference not buildable here: {why}")
    if importlib.util.find_spec("flydsl") is None:
        pytest.skip("DSL build needs the MLIR bindings (pip install flydsl==0.5.0)")


@pytest.mark.parametrize("op", ["fused_ar_rms_1stage", "allreduce_ll"])
def test_compare_gfx1250(op, tmp_path_factory, capsys):
    _need_tools()
    root = tmp_path_factory.mktemp("cmp")
    assert cli.main(["build", "--arch", "gfx1250", "--ops", op, "-o", str(root / "dsl"),
                     "-q"]) == 0
    capsys.readouterr()
    rc = cli.main(["compare", op, "--arch", "gfx1250", "--build", str(root / "dsl"),
                   "--ref-build", str(root / "ref"), "--ref", str(rb.REF_DIR / f"{op}.hip")])
    out = capsys.readouterr().out
    assert rc == 0, out
    dsl_sym = re.search(rf"^kernel\s+({op}_[0-9a-f]+)\s+(\S+)", out, re.M)
    assert dsl_sym, out
    assert dsl_sym.group(2) == C.ref_symbol(op, "bf16", 6144, 4)
    for cls in ("VGPRs", "SGPRs", "LDS bytes", "scratch bytes", "global load b128",
                "global store b128", "atomics", "waits (s_wait*)", "barriers", "branches",
                "total"):
        row = re.search(rf"^{re.escape(cls)}\s+(\d+)\s+(\d+)\s*$", out, re.M)
        assert row, f"no row {cls!r} in:\n{out}"
    # both kernels do real 16-byte traffic and meet at barriers
    b128 = re.search(r"^global load b128\s+(\d+)\s+(\d+)", out, re.M)
    assert int(b128.group(1)) > 0 and int(b128.group(2)) > 0
    # the reference build is idempotent: a second build leaves the code object alone
    art = rb.build_amd(rb.REF_DIR / f"{op}.hip", "gfx1250", root / "ref")
    mtime = art.code_object.stat().st_mtime_ns
    assert rb.build_amd(rb.REF_DIR / f"{op}.hip", "gfx1250", root / "ref").code_object \
        .stat().st_mtime_ns == mtime


def test_missing_clang_is_a_clear_reason(monkeypatch):
    monkeypatch.setattr(rb, "find_clang", lambda: None)
    assert "clang-22" in rb.missing_reason("gfx1250")
    assert cli.main(["compare", "allreduce_ll", "--arch", "gfx1250"]) == 2
