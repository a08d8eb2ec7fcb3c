"""gfx1250 code quality of the shipped kernels (issue 15 item 4), asserted on the ISA: LL
lines are single 16-byte system-scope stores that do not each wait for completion, polls
stay volatile, every rank's line / pack is read before the first wait, block-reduction
barriers wait on LDS only (Signal barriers keep their global waits), no scratch or spills,
VGPRs near the HIP reference. The counts come from benchmarks/gfx1250_codequality.py."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

import peerdsl.dsl as dsl
from peerdsl import reference_build as rb
from peerdsl.lowering import mlir_gen, pipeline
from peerdsl.ops import registry

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "gfx1250_codequality.py"
_spec = importlib.util.spec_from_file_location("gfx1250_codequality", _BENCH)
Q = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(Q)

_compiled: dict[tuple, pipeline.Compiled] = {}


def compiled(op: str, arch: str = "gfx1250", **cx) -> pipeline.Compiled:
    key = (op, arch, tuple(sorted(cx.items())))
    if key not in _compiled:
        spec = registry.load_all()[op]
        full = {"T": dsl.bf16, **cx}
        if op != "allreduce_ll":
            full["FP8"] = "e4m3fn" if arch != "gfx942" else "e4m3fnuz"
        _compiled[key] = pipeline.compile_kernel(spec.kernel.trace(**full), arch, f"q_{op}")
    return _compiled[key]


def ins(c: pipeline.Compiled) -> list[str]:
    return Q.instructions(Q.kernel_bodies(c.isa)[c.symbol])


# ----------------------------------------------------------------------------- LL stores

@pytest.mark.parametrize("W", [2, 8])
def test_ll_lines_are_system_scope_b128_stores_without_a_wait_each(W):
    lines = ins(compiled("allreduce_ll", W=W))
    waited, stores = Q.ll_store_waits(lines)
    assert stores == 2 * W          # two lines of a pack pushed to every rank
    assert waited == 0              # not one s_wait_storecnt 0 per store (a volatile store)
    # the only 16-byte stores are the lines, all at system scope (the sums go out as halves)
    assert [s for s in lines if s.startswith("global_store_b128")
            and "scope:SCOPE_SYS" not in s] == []


def test_ll_polls_stay_volatile_and_first_reads_are_not():
    text, _ = mlir_gen.generate(registry.load_all()["allreduce_ll"].kernel.trace(T=dsl.bf16, W=4),
                                "gfx1250", "ll")
    # one spin per half pack re-reads each of its W lines volatile (inside the `while`, each in
    # the `if` of a line not yet accepted); the first reads are av loads
    assert text.count("scf.while") == 2 and text.count("llvm.load volatile") == 2 * 4
    assert text.count('"llvm.amdgcn.av.load.b128"') == 2 * 4
    assert text.count('"llvm.amdgcn.av.store.b128"') == 2 * 4
    # each line's spin (a volatile load) waits for its data right after it; the first reads
    # of the lines are issued together and waited for one by one (s_wait_loadcnt N)
    lines = ins(compiled("allreduce_ll", W=4))
    scoped = [i for i, s in enumerate(lines) if s.startswith("global_load_b128")
              and "scope:SCOPE_SYS" in s]
    waited_at_once = [i for i in scoped if lines[i + 1] == "s_wait_loadcnt 0x0"]
    assert len(waited_at_once) == 2 * 4 and len(scoped) == 2 * (2 * 4)


def test_only_gfx1250_turns_off_auto_vectorizing():
    # targets.py auto_vectorize: SLP's f32 pairs cost the one-stage kernel 30+ VGPRs at W=8
    k = registry.load_all()["allreduce_ll"].kernel.trace(T=dsl.bf16, W=2)
    for arch, off in (("gfx1250", True), ("gfx942", False), ("gfx950", False), ("sm_90", False)):
        text, _ = mlir_gen.generate(k, arch, "ll")
        assert ('llvm.passthrough = ["noimplicitfloat"]' in text) == off, arch


def test_schedule_fences_lower_on_gfx1250_only():
    # targets.py schedule_fences: the FP8 epilogue's per-element fences (quant_row_fp8)
    k = registry.load_all()["per_token_quant_fp8"].kernel.trace(T=dsl.bf16, H=4096,
                                                                 FP8="e4m3fn")
    for arch, kept in (("gfx1250", True), ("gfx942", False), ("gfx950", False),
                       ("sm_90", False)):
        text, _ = mlir_gen.generate(k, arch, "q")
        assert ("llvm.amdgcn.sched.barrier" in text) == kept, arch


def test_other_targets_keep_volatile_packs():
    k = registry.load_all()["allreduce_ll"].kernel.trace(T=dsl.bf16, W=2)
    for arch in ("gfx942", "gfx950", "sm_90"):
        text, _ = mlir_gen.generate(k, arch, "ll")
        assert "llvm.amdgcn.av" not in text and "llvm.store volatile" in text, arch


# ----------------------------------------------------------------------------- gathers

@pytest.mark.parametrize("W", [2, 4, 8])
def test_ll_collect_reads_every_ranks_line_before_waiting(W):
    assert Q.max_load_burst(ins(compiled("allreduce_ll", W=W))) >= W


@pytest.mark.parametrize("op", ["fused_ar_rms_1stage", "fused_ar_rms_2stage"])
def test_fused_peer_loads_are_issued_back_to_back(op):
    # stage 1 of the two-stage kernel and the one-stage sum read W peers' packs at once
    assert Q.max_load_burst(ins(compiled(op, H=6144, W=4))) >= 4


# ----------------------------------------------------------------------------- barriers

@pytest.mark.parametrize("op,cx", [("fused_ar_rms_1stage", {"H": 6144, "W": 4}),
                                   ("fused_ar_rms_2stage", {"H": 6144, "W": 4}),
                                   ("add_rmsnorm", {"H": 8192})])
def test_reduction_barriers_wait_on_lds_only(op, cx):
    lines = ins(compiled(op, **cx))
    bad, lds = Q.barrier_global_waits(lines)
    assert lds >= 2 and bad == 0
    for near_lds, waits in Q._barriers(lines):
        if near_lds:
            assert "dscnt" in waits  # the scratch writes land before the barrier


def test_signal_barriers_keep_their_global_ordering():
    lines = ins(compiled("fused_ar_rms_1stage", H=6144, W=4))
    signal = [w for near_lds, w in Q._barriers(lines) if not near_lds]
    assert signal and any("storecnt" in x for w in signal for x in w)
    assert any(s.startswith("global_wb scope:SCOPE_SYS") for s in lines)  # the release


def test_shared_barrier_lowering_per_target():
    @dsl.kernel(block_size=64)
    def k(out: dsl.Ptr[dsl.f32]):
        sm = dsl.shared_array("x", dsl.f32, 64)
        sm[dsl.thread_id()] = 1.0
        dsl.shared_barrier()
        out[dsl.thread_id()] = sm[63 - dsl.thread_id()]
        dsl.barrier()

    t = k.trace()
    amd, _ = mlir_gen.generate(t, "gfx942", "k")
    nv, _ = mlir_gen.generate(t, "sm_90", "k")
    assert amd.count("gpu.barrier memfence [#gpu.address_space<workgroup>]") == 1
    assert amd.count("gpu.barrier") == 2
    assert nv.count("gpu.barrier") == 2 and "memfence" not in nv


# ----------------------------------------------------------------------------- resources

@pytest.mark.parametrize("op,cx", [("allreduce_ll", {"W": 8}),
                                   ("fused_ar_rms_1stage", {"H": 8192, "W": 8}),
                                   ("fused_ar_rms_2stage", {"H": 8192, "W": 8}),
                                   ("add_rmsnorm", {"H": 8192})])
def test_no_scratch_or_spills(op, cx):
    r = compiled(op, **cx).resources
    assert r["scratch_bytes"] == 0 and r["vgpr_spill"] == 0 and r["sgpr_spill"] == 0


@pytest.fixture(scope="module")
def hip_reference(tmp_path_factory):
    why = rb.missing_reason("gfx1250")
    if why:
        pytest.skip(f"HIP reference not buildable here: {why}")
    out = tmp_path_factory.mktemp("ref")
    d = None
    for op in ("allreduce_ll", "fused_ar_rms_1stage"):
        d = rb.build_amd(rb.REF_DIR / f"{op}.hip", "gfx1250", out).isa.parent
    return Q.reference(str(d))


# W=2 at H=4096 and 6144 met it once the FP8 epilogue converted one element at a time
# (dsl.schedule_fence, ops/_rows.py quant_row_fp8): 51 / 61 -> 38 / 49 VGPRs.
@pytest.mark.parametrize("op,cx", [("allreduce_ll", {"W": W}) for W in (2, 4, 8)]
                         + [("fused_ar_rms_1stage", {"H": H, "W": W})
                            for H in (2880, 4096, 6144, 7168, 8192) for W in (2, 4, 8)])
def test_vgprs_within_ten_percent_of_the_hip_reference(hip_reference, op, cx):
    ref = hip_reference[(op, tuple(cx.items()))]
    assert compiled(op, **cx).resources["vgpr"] <= 1.1 * ref["vgpr"]


def test_counters_on_a_known_snippet():
    body = """
	global_load_b128 v[0:3], v4, s[4:5] scope:SCOPE_SYS
	global_load_b128 v[4:7], v4, s[6:7] scope:SCOPE_SYS
	s_wait_loadcnt 0x1
	global_store_b128 v4, v[0:3], s[8:9] scope:SCOPE_SYS
	s_wait_storecnt 0x0
	global_store_b128 v4, v[0:3], s[10:11] scope:SCOPE_SYS
	s_barrier_signal -1
	s_barrier_wait -1
	ds_store_b32 v1, v2
	s_wait_storecnt_dscnt 0x0
	s_barrier_signal -1
	s_barrier_wait -1
	ds_load_b32 v3, v1
	s_wait_dscnt 0x0
	s_barrier_signal -1
	s_barrier_wait -1
"""
    lines = Q.instructions(body)
    assert Q.max_load_burst(lines) == 2
    assert Q.ll_store_waits(lines) == (1, 2)
    assert Q.barrier_global_waits(lines) == (1, 2)
    assert re.match(r"s_wait", lines[2])
