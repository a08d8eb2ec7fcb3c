"""Lowering: every DSL feature compiles for every target; ISA and code-object checks; errors
are Python exceptions that name the source line (CPU only)."""
from __future__ import annotations

import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import lowering_kernels as K  # noqa: E402

import peerdsl.dsl as dsl  # noqa: E402
from peerdsl.dsl import TraceError, ir  # noqa: E402
from peerdsl.lowering import codeobject, mlir_gen, pipeline  # noqa: E402
from peerdsl.lowering.errors import CompileError, LoweringError  # noqa: E402
from peerdsl.lowering.targets import TARGETS, get_target  # noqa: E402

ARCHS = list(TARGETS)
AMD = [a for a in ARCHS if TARGETS[a].is_amd]
_compiled: dict[tuple[str, str], pipeline.Compiled] = {}


def compiled(name: str, arch: str) -> pipeline.Compiled:
    """Compile once per session (the worker process is shared)."""
    if (name, arch) not in _compiled:
        k, cx = K.ALL[name]
        _compiled[name, arch] = pipeline.compile_kernel(k.trace(**cx), arch, f"t_{name}")
    return _compiled[name, arch]


# ----------------------------------------------------------------------------- targets

def test_targets_table():
    assert [TARGETS[a].wave_size for a in ("gfx1250", "gfx950", "gfx942", "sm_90")] == [32, 64, 64, 32]
    assert get_target("gfx942").fp8_format == "e4m3fnuz"
    assert {get_target(a).fp8_format for a in ("gfx1250", "gfx950", "sm_90")} == {"e4m3fn"}
    assert get_target("sm_90").syncscope("agent") == "device"
    assert get_target("gfx1250").syncscope("agent") == "agent"
    assert get_target("gfx1250").syncscope("system") == ""


def test_unknown_arch_names_supported():
    with pytest.raises(ValueError, match=r"gfx9000.*gfx1250, gfx950, gfx942, sm_90"):
        get_target("gfx9000")


def test_targets_module_is_pure_data():
    import peerdsl.lowering.targets as t
    src = open(t.__file__).read()
    assert "flydsl" not in src and "_mlir" not in src


# ----------------------------------------------------------------------------- compile all

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", list(K.ALL))
def test_every_feature_compiles(name, arch):
    c = compiled(name, arch)
    t = get_target(arch)
    assert c.binary and c.isa
    if t.is_amd:
        e_flags, meta = codeobject.amd_metadata(c.binary)
        assert e_flags & 0xFF == t.elf_mach
        k = meta["amdhsa.kernels"][0]
        assert k[".name"] == f"t_{name}" and k[".wavefront_size"] == t.wave_size
        assert c.resources["vgpr"] > 0 and c.resources["scratch_bytes"] == 0
    else:
        assert re.search(r"^\.target sm_90\b", c.isa, re.M)
        assert codeobject.cubin_info(c.binary)["e_machine"] in ("EM_CUDA", 190)
        assert c.resources["registers"] > 0 and c.resources["spill_stores"] == 0
    assert c.kernarg_size >= sum(a["size"] for a in c.args)
    assert [a["name"] for a in c.args] == [p.name for p in K.ALL[name][0].trace(
        **K.ALL[name][1]).params]


def test_elf_mach_per_amd_target():
    want = {"gfx1250": 0x49, "gfx950": 0x4F, "gfx942": 0x4C}
    for arch in AMD:
        e_flags, _ = codeobject.amd_metadata(compiled("mul_add", arch).binary)
        assert e_flags & 0xFF == want[arch]


def test_launch_bounds_reach_the_code_object():
    for arch in AMD:
        _, meta = codeobject.amd_metadata(compiled("features", arch).binary)
        assert meta["amdhsa.kernels"][0][".max_flat_workgroup_size"] == 128
    ptx = compiled("features", "sm_90").isa
    assert ".maxntid 128, 1, 1" in ptx and ".minnctapersm 4" in ptx  # >= 128 regs a thread


def test_peer_table_is_eight_pointer_params():
    c = compiled("peers", "gfx1250")
    names = [a["name"] for a in c.args]
    assert names[:8] == [f"sig_{i}" for i in range(8)]
    assert names[8:16] == [f"data_{i}" for i in range(8)]
    assert [a["offset"] for a in c.args[:16]] == list(range(0, 128, 8))


# ----------------------------------------------------------------------------- ISA checks

def test_gfx1250_isa():
    isa = compiled("memory_ops", "gfx1250").isa
    assert "global_load_b128" in isa
    assert re.search(r"global_atomic_add_u32 .*scope:SCOPE_SYS", isa)
    assert re.search(r"global_store_b32 .*scope:SCOPE_SYS", isa)
    assert re.search(r"global_atomic_add_u32 .*scope:SCOPE_DEV", isa)      # agent
    assert re.search(r"global_store_b128 .*scope:SCOPE_SYS", isa)          # scoped pack
    assert "global_load_b128" in compiled("features", "gfx1250").isa


@pytest.mark.parametrize("arch", ["gfx942", "gfx950"])
def test_gfx9_cache_bits(arch):
    isa = compiled("memory_ops", arch).isa
    assert re.search(r"global_load_dword .*sc0 sc1", isa)                  # system acquire
    assert re.search(r"global_store_dword .*sc0 sc1", isa)
    assert re.search(r"buffer_wbl2 sc0 sc1", isa)                          # system release
    assert re.search(r"global_store_dwordx4 .*\bnt\b", isa)                # nontemporal


def test_ptx_scopes_and_orders():
    ptx = compiled("memory_ops", "sm_90").isa
    for pat in (r"ld\.acquire\.sys\.global", r"st\.release\.sys\.global",
                r"atom\.acq_rel\.sys\.global\.add", r"atom\.acq_rel\.gpu\.global\.cas",
                r"atom\.relaxed\.sys\.global\.add\.f32", r"atom\.relaxed\.sys\.global\.max\.s32",
                r"atom\.relaxed\.sys\.global\.exch", r"fence\.acq_rel\.sys",
                r"ld\.acquire\.cta\.shared", r"ld\.volatile\.global\.v4"):
        assert re.search(pat, ptx), pat


def test_no_contraction_of_mul_add():
    for arch in AMD:
        isa = compiled("mul_add", arch).isa
        assert "v_mul_f32" in isa and "v_add_f32" in isa, arch
        assert not re.search(r"v_(fma|fmac|mad|mac)_", isa), arch
    ptx = compiled("mul_add", "sm_90").isa
    assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx and "fma" not in ptx


def test_correctly_rounded_math_on_nvidia():
    ptx = compiled("features", "sm_90").isa
    assert "sqrt.rn.f32" in ptx and ("div.rn.f32" in ptx or "rcp.rn.f32" in ptx)
    assert not re.search(r"\.approx|\.ftz|call", ptx)  # no approximations, no libdevice


def test_amd_math_has_no_device_library_calls():
    for arch in AMD:
        isa = compiled("features", arch).isa
        assert "__ocml" not in isa and "__ockl" not in isa and "s_swappc" not in isa, arch


def test_shfl_and_grid_dim_lowering():
    from peerdsl.ops.vector_add import vector_add
    k = vector_add.trace(T=dsl.bf16)
    amd, _ = mlir_gen.generate(k, "gfx942", "v")
    nv, _ = mlir_gen.generate(k, "sm_90", "v")
    assert "llvm.amdgcn.dispatch.ptr" in amd and "gpu.grid_dim" not in amd  # no ockl call
    assert "gpu.grid_dim x" in nv
    assert "gpu.block_dim" not in amd + nv  # the block size is a constant
    feat, _ = mlir_gen.generate(K.features.trace(**K.ALL["features"][1]), "gfx942", "f")
    assert re.search(r"gpu\.shuffle xor %\w+, %\w+, %\w+ : f32", feat)


# ----------------------------------------------------------------------------- MLIR text

def test_mlir_text_scopes_and_locations():
    k = K.memory_ops.trace()
    amd, _ = mlir_gen.generate(k, "gfx1250", "m")
    nv, _ = mlir_gen.generate(k, "sm_90", "m")
    assert 'syncscope("agent")' in amd and 'syncscope("wavefront")' in amd
    assert 'syncscope("device")' in nv and 'syncscope("block")' in nv
    assert "agent" not in nv and "wavefront" not in nv
    assert "monotonic" in amd and "nontemporal" in amd
    # a scoped pack: av intrinsics with the scope on gfx1250, volatile elsewhere
    assert 'llvm.amdgcn.av.store.b128' in amd and '#llvm.md_string<"">' in amd
    assert "volatile" in mlir_gen.generate(k, "gfx942", "m")[0]
    assert 'loc("' in amd and "lowering_kernels.py" in amd
    assert "llvm.mlir.global internal @smem0_flags" in amd


def test_mlir_semantics_choices():
    text, _ = mlir_gen.generate(K.features.trace(**K.ALL["features"][1]), "sm_90", "f")
    assert "arith.divsi" in text and "arith.remsi" in text and "arith.shrui" in text
    assert '"llvm.maxnum.f32"' in text and '"llvm.minnum.f32"' in text
    assert '"llvm.sqrt.f32"' in text and '"llvm.fma.f32"' in text and '"llvm.fabs.f32"' in text
    assert "arith.truncf" in text and "math." not in text
    assert "scf.for" in text and "scf.while" in text and "scf.if" in text
    assert '"llvm.readsteadycounter"' in text


# ----------------------------------------------------------------------------- errors

def test_dsl_type_error_names_the_line():

    @dsl.kernel(block_size=32)
    def bad(a: dsl.Ptr[dsl.f32], n: dsl.i32):
        a[0] = a[0] + n  # f32 + i32: an error at trace time

    with pytest.raises(TraceError, match=r"test_lowering\.py:\d+"):
        bad.trace()


def _hand_kernel(bad_type: bool) -> ir.Kernel:
    """a[0] = x + 1.0 built by hand, optionally with an i32 operand (a bad IR)."""
    ptr = ir.PtrType(ir.f32)
    body = ir.Block()
    a, x = ir.Value(ptr, body), ir.Value(ir.f32, body)
    c = ir.Op("const", [], [], {"value": 1 if bad_type else 1.0}, loc="/src/user.py:42")
    c.results = [ir.Value(ir.i32 if bad_type else ir.f32, c)]
    add = ir.Op("add", [x, c.result], [], {}, loc="/src/user.py:43")
    add.results = [ir.Value(ir.f32, add)]
    st = ir.Op("store", [a, add.result], [], {"scope": None, "order": None,
                                              "nontemporal": False}, loc="/src/user.py:44")
    body.ops = [c, add, st]
    body.args = [a, x]
    return ir.Kernel("hand", [ir.Param("a", ptr, a), ir.Param("x", ir.f32, x)], body, 32, {}, [])


def test_bad_ir_raises_with_source_line():
    with pytest.raises(LoweringError, match=r"/src/user\.py:43.*operand types differ"):
        pipeline.compile_kernel(_hand_kernel(True), "gfx1250")
    assert isinstance(pipeline.compile_kernel(_hand_kernel(False), "gfx942").binary, bytes)


def test_mlir_error_is_exception_with_source_line():
    c = pipeline.Compiled(get_target("gfx1250"), "x", _hand_kernel(False))
    pipeline.stage_generate(c)
    c.mlir = c.mlir.replace("arith.addf", "arith.addi")  # invalid for floats: MLIR rejects
    with pytest.raises(CompileError, match=r"user\.py:43"):
        pipeline.stage_rocdl(c)


def test_worker_crash_becomes_compile_error_and_recovers():
    with pytest.raises(CompileError, match="worker died"):
        pipeline.abort_worker_for_test()
    c = pipeline.compile_kernel(_hand_kernel(False), "sm_90")  # a fresh worker
    assert b"hand" in c.binary


_ASSERTING_MLIR = """
module attributes {gpu.container_module} {
  gpu.module @m [#rocdl.target<chip = "gfx942", O = 3>] {
    gpu.func @k(%a: i32) kernel attributes {gpu.kernel} {
      gpu.return
    }
  }
}
"""


def test_llvm_assert_in_a_pass_is_compile_error():
    # verifies fine, then convert-gpu-to-rocdl hits an assert (abort) in the bundled LLVM
    with pytest.raises(CompileError, match=r"(?s)for gfx942: the MLIR worker died.*"
                       "DictionaryAttr element names must be unique"):
        pipeline.compile_mlir(_ASSERTING_MLIR, "gfx942")
    assert compiled("mul_add", "gfx942").binary  # later compiles still work
    assert pipeline.compile_kernel(_hand_kernel(False), "gfx942").binary


def test_hung_worker_is_killed(monkeypatch):
    monkeypatch.setenv("PEERDSL_COMPILE_TIMEOUT", "1")
    with pytest.raises(CompileError, match="killed after 1 s"):
        pipeline.abort_worker_for_test(hang=True)
    monkeypatch.delenv("PEERDSL_COMPILE_TIMEOUT")
    assert pipeline.compile_kernel(_hand_kernel(False), "sm_90").binary


def test_unknown_op_is_lowering_error():
    k = _hand_kernel(False)
    k.body.ops[1].name = "frobnicate"
    with pytest.raises(LoweringError, match=r"user\.py:43.*frobnicate"):
        mlir_gen.generate(k, "sm_90")


# ----------------------------------------------------------------------------- metadata

def test_ptxas_log_parsing():
    log = ("ptxas info    : Compiling entry function 'k1' for 'sm_90'\n"
           "ptxas info    : Function properties for k1\n"
           "    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem\n")
    r = codeobject.parse_ptxas_log(log, "k1")
    assert r == {"registers": 40, "spill_stores": 8, "spill_loads": 4, "stack_bytes": 16,
                 "smem_bytes": 512, "barriers": 1}


def test_nvidia_param_layout_natural_alignment():

    @dsl.kernel(block_size=32)
    def mixed(n: dsl.i32, p: dsl.Ptr[dsl.f32], m: dsl.i32, x: dsl.i64, f: dsl.f32):
        p[0] = f

    args, size = codeobject.nvidia_params(mixed.trace())
    assert [(a["offset"], a["size"]) for a in args] == [(0, 4), (8, 8), (16, 4), (24, 8), (32, 4)]
    assert size == 36
    nv = pipeline.compile_kernel(mixed.trace(), "sm_90", "mixed")  # checked against .nv.info
    params, total = codeobject.cubin_params(nv.binary, "mixed")
    assert params == [(0, 0, 4), (1, 8, 8), (2, 16, 4), (3, 24, 8), (4, 32, 4)] and total == 36
    amd = pipeline.compile_kernel(mixed.trace(), "gfx1250", "mixed")
    assert [a["offset"] for a in amd.args] == [0, 8, 16, 24, 32]
