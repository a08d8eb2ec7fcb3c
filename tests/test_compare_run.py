"""`peerdsl compare --run`, the parts that need no GPU: recipe loading, the shipped recipes run
on CPU tensors, both sides packed by PackPlan (the reference through its code object's
layout), the launch glue against the fake CUDA driver, and the report."""
from __future__ import annotations

import importlib.util
import struct

import pytest
import torch

from cuda_fakes import FakeDriver
from peerdsl import compare_gpu as G
from peerdsl import compare_run as R
from peerdsl import compare_sides as cs
from peerdsl import layout
from peerdsl import reference_build as rb
from peerdsl.runtime.kernarg import pack_args

SHAPES = {"fused_ar_rms_1stage": {"T": "bf16", "H": 6144, "W": 4},
          "allreduce_ll": {"T": "bf16", "W": 4}}
REF_SYMBOLS = {"fused_ar_rms_1stage": "fused_ar_rms_1stage_bf16_h6144_w4",
               "allreduce_ll": "allreduce_ll_bf16_w4"}


# ----------------------------------------------------------------------------- recipes
def test_load_recipe_by_module_and_by_file(tmp_path):
    assert R.load_recipe("peerdsl.compare_recipes:allreduce_ll") is \
        R.default_recipe("allreduce_ll")
    f = tmp_path / "my_recipes.py"
    f.write_text("from peerdsl.compare_run import recipe\n"
                 "@recipe(constexprs={'T': 'bf16'})\ndef mine(ctx):\n    return ctx.world\n")
    fn = R.load_recipe(f"{f}:mine")
    assert fn.constexprs == {"T": "bf16"} and fn.peerdsl_recipe
    for bad, msg in [("nocolon", "expected MODULE:FUNCTION"), (f"{f}:absent", "no function"),
                     ("no.such.module:f", "cannot import module"),
                     (f"{tmp_path / 'gone.py'}:f", "does not exist")]:
        with pytest.raises(R.CompareError, match=msg):
            R.load_recipe(bad)


def test_default_recipes_carry_the_default_variant():
    assert R.default_recipe("fused_ar_rms_1stage").constexprs == SHAPES["fused_ar_rms_1stage"]
    assert R.default_recipe("allreduce_ll").constexprs == SHAPES["allreduce_ll"]
    assert R.default_recipe("vector_add") is None  # no recipe: --run asks for --inputs


def _ctx(op: str, rows: int = 4, **kw) -> R.RunContext:
    return R.RunContext(torch=torch, device="cpu", world=4, constexprs=dict(SHAPES[op]),
                        block=256, max_grid=kw.pop("max_grid", 8),
                        options={"rows": str(rows), **kw})


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_shipped_recipe_makes_a_consistent_case(op):
    case = R.default_recipe(op)(_ctx(op))
    assert len(case.dsl_args) == len(case.ref_args) == 4
    assert [a["rank"] for a in case.dsl_args] == [0, 1, 2, 3]
    assert 1 <= case.grid <= 8  # at most max_grid: every block of every rank resident
    assert set(case.signals) == {"DSL", "reference"}
    dsl_sigs, ref_sigs = case.signals["DSL"], case.signals["reference"]
    assert all(s[layout.SIG_SPIN_LIMIT] == R.SPIN_LIMIT for s in dsl_sigs + ref_sigs)
    assert not {s.data_ptr() for s in dsl_sigs} & {s.data_ptr() for s in ref_sigs}
    for o in case.outputs:  # each side writes its own buffers
        assert not {t.data_ptr() for t in o.dsl} & {t.data_ptr() for t in o.ref}
    with pytest.raises(R.CompareError, match="bf16 only"):
        R.default_recipe(op)(R.RunContext(torch=torch, device="cpu", world=2,
                                          constexprs={**SHAPES[op], "T": "f16"}, block=256,
                                          max_grid=4))


def test_recipe_options_are_checked():
    with pytest.raises(R.CompareError, match="expected int"):
        R.default_recipe("allreduce_ll")(_ctx("allreduce_ll", rows="many"))
    with pytest.raises(R.CompareError, match="LL cap"):
        R.default_recipe("allreduce_ll")(_ctx("allreduce_ll", rows=4096))


# ----------------------------------------------------------------------------- packing
@pytest.fixture(scope="module")
def sm90_kernels(tmp_path_factory):
    """The sm_90 DSL kernels of both shipped ops, compiled through the build cache."""
    if importlib.util.find_spec("flydsl") is None:
        pytest.skip("the DSL build needs the MLIR bindings (pip install flydsl==0.5.0)")
    out = tmp_path_factory.mktemp("dsl")
    cs.import_modules([])
    return {op: cs.compile_on_demand(op, "sm_90", q, out) for op, q in SHAPES.items()}


@pytest.fixture(scope="module", params=["gfx1250", "sm_90"])
def ref_code(request, tmp_path_factory):
    """(arch, {op: (code object path, its parameter layout, total bytes)}) of the shipped
    references, the layout as their code object records it (AMD note or cubin .nv.info)."""
    arch = request.param
    why = rb.missing_reason(arch)
    if why:
        pytest.skip(why)
    out = tmp_path_factory.mktemp(f"ref_{arch}")
    found = {}
    for op, sym in REF_SYMBOLS.items():
        art = rb.build(rb.REF_DIR / f"{op}.hip", arch, out)
        params, total = cs.ref_param_layout(arch, art.code_object.read_bytes(), sym)
        found[op] = (art.code_object, params, total)
    return arch, found


def _addresses(v):
    """Values as the checked packer takes them (it refuses CPU tensors)."""
    if isinstance(v, list):
        return [_addresses(x) for x in v]
    return v.data_ptr() if hasattr(v, "data_ptr") else v


def _expected_ref_bytes(params, total, values) -> bytes:
    """An oracle independent of PackPlan: the C layout filled field by field."""
    buf = bytearray(total)
    for (off, size), v in zip(params, values):
        if isinstance(v, list):
            addrs = [_addresses(x) for x in v]
            addrs += [addrs[0]] * (size // 8 - len(addrs))
            struct.pack_into(f"<{size // 8}Q", buf, off, *addrs)
        elif hasattr(v, "data_ptr"):
            struct.pack_into("<Q", buf, off, v.data_ptr())
        elif isinstance(v, float):
            struct.pack_into("<f", buf, off, v)
        else:
            struct.pack_into("<i", buf, off, v)
    return bytes(buf)


@pytest.mark.parametrize("op", sorted(SHAPES))
def test_both_sides_pack_through_packplan(op, sm90_kernels, ref_code):
    arch, refs = ref_code
    entry = sm90_kernels[op].entry
    case = R.default_recipe(op)(_ctx(op))
    path, params, total = refs[op]
    rentry = R.ref_entry(REF_SYMBOLS[op], path, "0" * 64, params, case.ref_args[0], total, 256)
    assert rentry.kernarg_size == total and rentry.block_size == 256
    for r in range(4):
        got = R.pack_dsl(entry, case.dsl_args[r], r)
        want = pack_args(entry.args, entry.kernarg_size,
                         {"call": R.COMPARE_CALL_TAG,  # the dsl.CallId pack_dsl fills
                          **{k: _addresses(v) for k, v in case.dsl_args[r].items()}})
        assert got == want  # PackPlan writes what the checked path would
        assert R.pack_ref(rentry, case.ref_args[r]) == \
            _expected_ref_bytes(params, total, case.ref_args[r]), (arch, r)
    # the peer tables really are the struct parameters (8 pointers, padded with the first)
    (off, size) = params[2] if op == "allreduce_ll" else params[5]
    assert size == 8 * layout.MAX_RANKS
    sig = case.signals["reference"]
    words = struct.unpack_from("<8Q", R.pack_ref(rentry, case.ref_args[1]), off)
    assert list(words) == [s.data_ptr() for s in sig] + [sig[0].data_ptr()] * 4


def test_reference_layout_mismatches_are_named():
    t = torch.zeros(4)
    layout_ = [(0, 8), (8, 64), (72, 4), (76, 4)]
    good = [t, [t, t], 3, 1.5]
    e = R.ref_entry("k", "k.cubin", "0" * 64, layout_, good, 80, 128)
    assert [a.name for a in e.args][:3] == ["p0", "p1_0", "p1_1"]
    assert [a.type.text for a in e.args][-2:] == ["i32", "f32"]
    cases = [([t, [t], 3], "takes 4 parameters"),
             ([t, [t] * 9, 3, 1.5], "got 9 entries"),
             ([t, [t], t, 1.5], "Tensor value for a 4-byte slot"),
             ([t, [t], True, 1.5], "bool value"),
             ([R.i32(1), [t], 3, 1.5], "as i32 \\(4 bytes\\)")]
    for values, msg in cases:
        with pytest.raises(R.CompareError, match=msg):
            R.ref_entry("k", "k.cubin", "0" * 64, layout_, values, 80, 128)
    # an explicit type, and a negative int in a pointer-sized slot, read as i64
    e = R.ref_entry("k", "k.cubin", "0" * 64, [(0, 8), (8, 8)], [R.i64(-2), -3], 16, 64)
    assert [a.type.text for a in e.args] == ["i64", "i64"]
    assert struct.unpack("<qq", R.pack_ref(e, [R.i64(-2), -3])) == (-2, -3)


def test_dsl_arguments_are_checked_by_name(sm90_kernels):
    entry = sm90_kernels["allreduce_ll"].entry
    case = R.default_recipe("allreduce_ll")(_ctx("allreduce_ll"))
    args = dict(case.dsl_args[0])
    del args["n_packs"]
    args["bogus"] = 1
    with pytest.raises(R.CompareError, match=r"missing \['n_packs'\], unknown \['bogus'\]"):
        R.pack_dsl(entry, args)


# ----------------------------------------------------------------------------- launch glue
def test_prepare_and_launch_against_the_fake_driver(sm90_kernels, tmp_path):
    """Both kernels launch through CudaKernel in buffer mode with the packed bytes."""
    from peerdsl.runtime import cuda as pcuda
    from peerdsl.runtime.cuda import _driver
    k = sm90_kernels["fused_ar_rms_1stage"]
    ref_params = [(0, 64), (64, 8), (72, 8), (80, 8), (88, 8), (96, 64), (160, 4), (164, 4),
                  (168, 4)]  # the reference's C signature, as the driver reports it
    sym = REF_SYMBOLS["fused_ar_rms_1stage"]
    cubin = tmp_path / "ref.cubin"
    cubin.write_bytes(b"\x7fELF fake cubin")
    drv = FakeDriver(param_layout={k.entry.symbol: [(a.offset, a.size) for a in k.entry.args],
                                   sym: ref_params})
    pcuda.clear_caches()
    try:
        with _driver.use_driver(drv):
            dsl, ref = G.load_pair(k.manifest, k.entry, cubin, sym, 0)
            assert ref.params == ref_params and ref.size == 172
            case = R.default_recipe("fused_ar_rms_1stage")(_ctx("fused_ar_rms_1stage"))
            p = G.prepare(case, 4, dsl, ref)
            p.ref.launch(case.grid, p.ref_bytes[2], stream=0)
            p.dsl.launch(case.grid, p.dsl_bytes[2], stream=0)
            with pytest.raises(R.CompareError, match="2 DSL and 4 reference"):
                G.prepare(R.RunCase(case.dsl_args[:2], case.ref_args, case.outputs, 1), 4,
                          dsl, ref)
    finally:
        pcuda.clear_caches()
    ref_launch, dsl_launch = drv.launches
    assert ref_launch["symbol"] == sym and dsl_launch["symbol"] == k.entry.symbol
    assert ref_launch["block"] == dsl_launch["block"] == (256, 1, 1)
    assert ref_launch["grid"] == (case.grid, 1, 1)
    assert ref_launch["extra"][1] == p.ref_bytes[2] and dsl_launch["extra"][1] == p.dsl_bytes[2]
    assert struct.unpack_from("<i", p.ref_bytes[2], 160) == (2,)  # rank 2's own rank


# ----------------------------------------------------------------------------- report
def test_report_and_readback_helpers():
    sigs = [torch.zeros(layout.SIGNAL_BYTES // 4, dtype=torch.int32) for _ in range(2)]
    sigs[1][layout.SIG_ERROR:layout.SIG_ERROR + 6] = torch.tensor([1, 1, 3, 2, 9, 8])
    errs = R.signal_errors(sigs, "DSL")
    assert len(errs) == 1 and errs[0].startswith("DSL rank 1: spin expired: rank 1 block 3")
    a = torch.tensor([1.0, float("nan")], dtype=torch.bfloat16)
    b = a.clone()
    assert R.same_bytes(a, b)
    b.view(torch.int16)[1] ^= 1  # another NaN payload: not the same bytes
    assert not R.same_bytes(a, b) and not R.same_bytes(a, a.float())
    rep = R.RunReport("NVIDIA H200", "rows=4", 4, 8, (256, 256),
                      [("out rank 0: DSL == reference", True), ("out rank 1", False)], errs,
                      (10.0, 12.5), "CUDA graph")
    text = R.format_report(rep)
    assert not rep.ok
    assert "  OK   out rank 0: DSL == reference" in text and "  DIFF out rank 1" in text
    assert "ERROR DSL rank 1" in text and "DSL 10.0 us, reference 12.5 us, DSL/ref 0.80" in text
    assert text.endswith("FAIL: 1/2 byte-equal, 1 spin errors")
    ok = R.RunReport("x", "", 2, 1, (256, 128), [("out", True)], [], None)
    assert ok.ok and R.format_report(ok).endswith("PASS: 1/1 byte-equal, 0 spin errors")
