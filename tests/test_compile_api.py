"""`peerdsl.compile(kernel, target, **constexprs)`: code, ISA, argument layout, resources and
occupancy, through the same cache as `peerdsl build`; bad input raises before compiling."""
from __future__ import annotations

import inspect
import re
import shutil
import subprocess

import pytest

import peerdsl
import peerdsl.dsl as dsl
from peerdsl.lowering import build as B
from peerdsl.lowering.occupancy import AMD_FACTS, amd_occupancy
from peerdsl.ops import registry


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("PEERDSL_CACHE_DIR", str(d))
    return d


@dsl.kernel(block_size=128)
def api_probe(x: dsl.Ptr["T"], out: dsl.Ptr[dsl.f32], n: dsl.i32, T: dsl.constexpr,
              SCALE: dsl.constexpr = 2):
    i = dsl.block_id() * dsl.block_size() + dsl.thread_id()
    v = 0.0
    if i < n:
        v = x[i].to_f32() * float(SCALE)
    out[i] = dsl.block_sum(v)  # a shared-memory reduction: the kernel declares LDS


@dsl.kernel(block_size=256)
def lds_hog(out: dsl.Ptr[dsl.f32], WORDS: dsl.constexpr):
    """Declares WORDS f32 of shared memory: enough of it limits occupancy by LDS."""
    buf = dsl.shared_array("hog", dsl.f32, WORDS)
    t = dsl.thread_id()
    buf[t] = t.to(dsl.f32)
    dsl.barrier()
    out[t] = buf[WORDS - 1 - t]


@dsl.kernel(block_size=32)
def bad_kernel(a: dsl.Ptr[dsl.bf16]):
    a[0] = a[0] * 2.0  # bf16 arithmetic: refused


BAD_LINE = inspect.getsourcelines(bad_kernel.fn)[1] + 2


def test_compile_gfx1250(cache_dir):
    k = peerdsl.compile(api_probe, "gfx1250", T="bf16")
    assert isinstance(k, peerdsl.CompiledKernel) and not k.cached
    assert k.target == "gfx1250" and k.name == api_probe.instance_name(T=dsl.bf16, SCALE=2)
    assert k.code[:4] == b"\x7fELF" and k.code[48] == 0x49  # e_flags mach: gfx1250
    assert f"{k.name}:" in k.isa and "global_load" in k.isa
    assert [(a["name"], a["type"], a["offset"], a["size"]) for a in k.args] == [
        ("x", "ptr<bf16>", 0, 8), ("out", "ptr<f32>", 8, 8), ("n", "i32", 16, 4)]
    assert k.kernarg_size >= 20 and k.block_size == 128
    r = k.resources
    assert {"vgpr", "agpr", "sgpr", "lds_bytes", "scratch_bytes", "vgpr_spill", "sgpr_spill",
            "waves_per_simd", "occupancy_limit"} <= set(r)
    assert r["lds_bytes"] == k.lds_bytes == 32 * 4  # block_sum's 32-word scratch
    assert r["vgpr"] > 0 and r["scratch_bytes"] == 0
    assert (r["waves_per_simd"], r["occupancy_limit"]) == amd_occupancy(
        "gfx1250", 32, 128, r["vgpr"], r["sgpr"], k.lds_bytes)
    assert k.constexprs == {"T": "bf16", "SCALE": 2}
    again = peerdsl.compile(api_probe, "gfx1250", T=dsl.bf16, SCALE=2)  # same variant
    assert again.cached and again.code == k.code and again.entry == k.entry


def test_compile_shares_the_build_cache(tmp_path, cache_dir):
    saved = dict(registry.load_all())  # the shipped ops stay registered after the test
    try:
        peerdsl.register_op("api_probe", api_probe, [{"T": dsl.f16}])
        seen = []
        m = B.build("gfx950", ["api_probe"], str(tmp_path / "out"), progress=seen.append)
    finally:
        registry.REGISTRY.clear()
        registry.REGISTRY.update(saved)
    assert [r.cached for r in seen] == [False]
    k = peerdsl.compile(api_probe, "gfx950", T="f16")
    assert k.cached  # the build's compile is reused, not repeated
    assert m["kernels"][k.name] == k.entry
    code, isa = k.save(str(tmp_path / "saved"))
    assert open(code, "rb").read() == (tmp_path / "out" / "gfx950" / k.entry["file"]).read_bytes()


def test_compile_sm90_resources(cache_dir):
    k = peerdsl.compile(lds_hog, "sm_90", WORDS=1024)
    r = k.resources
    assert {"registers", "local_bytes", "shared_bytes", "spill_stores", "spill_loads",
            "stack_bytes"} <= set(r)
    assert r["registers"] > 0 and r["local_bytes"] == r["stack_bytes"] == 0
    assert r["shared_bytes"] == k.lds_bytes == 4096
    assert ".entry " + k.name in k.isa and k.code[:4] == b"\x7fELF"
    assert [a["name"] for a in k.args] == ["out"]


def test_lds_limits_occupancy_on_gfx942(cache_dir):
    """40 KiB of LDS per 256-thread block: one block per 64 KiB CU, its 4 waves over 4 SIMDs."""
    k = peerdsl.compile(lds_hog, "gfx942", WORDS=10240)
    assert k.lds_bytes == 40960
    assert (k.resources["waves_per_simd"], k.resources["occupancy_limit"]) == (1, "lds")
    small = peerdsl.compile(lds_hog, "gfx942", WORDS=256)
    assert small.resources["waves_per_simd"] > 1


# ----------------------------------------------------------------------------- bad input

def test_missing_and_unknown_constexprs_are_named():
    with pytest.raises(B.BuildError) as e:
        peerdsl.compile(api_probe, "gfx1250")
    msg = str(e.value)
    assert "missing constexpr T" in msg and "['T', 'SCALE']" in msg and "api_probe" in msg
    assert "SCALE" not in msg.split("Kernel")[0]  # a constexpr with a default is optional
    with pytest.raises(B.BuildError, match="unknown constexpr H"):
        peerdsl.compile(api_probe, "gfx1250", T="bf16", H=4096)


def test_unknown_target_and_non_kernel():
    with pytest.raises(ValueError, match="'gfx900'; supported: gfx1250, gfx950, gfx942, sm_90"):
        peerdsl.compile(api_probe, "gfx900", T="bf16")
    with pytest.raises(B.BuildError, match="needs a @dsl.kernel"):
        peerdsl.compile(lambda: None, "gfx1250")


def test_a_kernel_that_does_not_trace_names_the_line():
    with pytest.raises(B.KernelTraceError) as e:
        peerdsl.compile(bad_kernel, "gfx1250")
    assert f"{__file__}:{BAD_LINE}" in str(e.value) and "bf16" in str(e.value)
    assert isinstance(e.value, dsl.TraceError) and isinstance(e.value, ValueError)


# ----------------------------------------------------------------------------- occupancy

def _llc_occupancy(arch: str, clobbers: str, lds: int, block: int) -> tuple[int, int, int]:
    """(llc's "; Occupancy:", .vgpr_count, .sgpr_count) of a kernel using the clobbered
    registers and `lds` bytes of LDS at a fixed block size."""
    ll = f'''target triple = "amdgcn-amd-amdhsa"
@lds = internal addrspace(3) global [{lds} x i8] undef, align 16
define amdgpu_kernel void @k(ptr addrspace(1) %p) #0 {{
  call void asm sideeffect "", "{clobbers}"()
  %g = getelementptr [{lds} x i8], ptr addrspace(3) @lds, i32 0, i32 1
  store volatile i8 1, ptr addrspace(3) %g
  ret void
}}
attributes #0 = {{ "amdgpu-flat-work-group-size"="{block},{block}" }}
'''
    p = subprocess.run(["llc-22", "-mtriple=amdgcn-amd-amdhsa", f"-mcpu={arch}", "-o", "-"],
                       input=ll, capture_output=True, text=True, check=True)
    get = lambda pat: int(re.search(pat, p.stdout).group(1))  # noqa: E731
    return get(r"; Occupancy: (\d+)"), get(r"\.vgpr_count:\s+(\d+)"), get(r"\.sgpr_count:\s+(\d+)")


OCC_CASES = [  # (arch, clobbers, LDS bytes, block size): each limit on each family
    ("gfx1250", "~{v63}", 16, 256), ("gfx1250", "~{v100}", 16, 256),
    ("gfx1250", "~{v200}", 16, 1024), ("gfx1250", "~{v10}", 8192, 32),
    ("gfx1250", "~{v10}", 16, 64), ("gfx1250", "~{v10}", 100000, 512),
    ("gfx1250", "~{v120}", 65536, 256),
    ("gfx950", "~{v72}", 16, 256), ("gfx950", "~{v40},~{a60}", 16, 64),
    ("gfx950", "~{v10}", 32768, 256), ("gfx950", "~{v10}", 16384, 64),
    ("gfx942", "~{v10},~{s94}", 16, 256), ("gfx942", "~{v129}", 16, 128),
    ("gfx942", "~{v10}", 10000, 256), ("gfx942", "~{v10}", 20000, 512),
    ("gfx942", "~{v10}", 4096, 32),
]


@pytest.mark.skipif(shutil.which("llc-22") is None, reason="needs llc-22 (LLVM 22)")
@pytest.mark.parametrize("arch,clobbers,lds,block", OCC_CASES)
def test_occupancy_matches_llvm(arch, clobbers, lds, block):
    llvm, vgpr, sgpr = _llc_occupancy(arch, clobbers, lds, block)
    wave = 32 if arch == "gfx1250" else 64
    mine, limit = amd_occupancy(arch, wave, block, vgpr, sgpr, lds)
    assert mine == llvm, (arch, clobbers, lds, block, vgpr, sgpr, limit)
    assert 1 <= mine <= AMD_FACTS[arch].max_waves_per_simd


def test_occupancy_limits_are_named():
    assert amd_occupancy("gfx1250", 32, 256, 24, 40, 0) == (16, "waves")
    assert amd_occupancy("gfx1250", 32, 256, 192, 40, 0) == (5, "vgpr")  # 1024 // 192
    assert amd_occupancy("gfx1250", 32, 256, 193, 40, 0) == (4, "vgpr")  # 1024 // 208
    assert amd_occupancy("gfx942", 64, 256, 20, 104, 0) == (7, "sgpr")
    assert amd_occupancy("gfx942", 64, 256, 20, 20, 20000) == (3, "lds")
    assert amd_occupancy("gfx1250", 32, 64, 20, 20, 0) == (8, "workgroup")  # 16 barriers
    assert amd_occupancy("gfx942", 64, 256, 20, 20, 70000) == (0, "lds")  # does not fit


def test_simulator_is_reachable_after_a_plain_import():
    """README and TUTORIAL write `import peerdsl` then `peerdsl.sim.run(...)`."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import peerdsl; print(peerdsl.sim.run.__name__)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "run"
