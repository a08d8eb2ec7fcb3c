"""docs/TUTORIAL.md's worked example (examples/ar_bias_rmsnorm/): the new fused collective
all-reduce + bias + residual + RMSNorm is exact on the simulator under rank skew (TP2, TP4),
builds for gfx1250 without scratch or spills, and its HIP twin compiles for gfx1250."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ar_bias_rmsnorm"
sys.path.insert(0, str(EXAMPLE))

import ar_bias_rmsnorm_ref as ref  # noqa: E402


def _load(name: str):
    """An example script as a module under a name no other test uses."""
    spec = importlib.util.spec_from_file_location(f"example_abr_{name}", EXAMPLE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


check_sim = _load("check_sim")
check_build = _load("check_build")

SIM_CASES = [  # (world, rows, hidden, dtype, seed, skew, grid): rows > grid runs the row loop
    (2, 3, 2880, torch.bfloat16, 0, [0, 400], 2),
    (2, 2, 6144, torch.float16, 1, [350, 0], 2),
    (4, 5, 6144, torch.bfloat16, 2, [0, 300, 50, 900], 2),
    (4, 3, 4096, torch.float16, 3, 200, 3),
    (4, 2, 2880, torch.bfloat16, 4, [700, 0, 0, 120], 1),
]


@pytest.mark.parametrize("world,rows,hidden,dtype,seed,skew,grid", SIM_CASES)
def test_simulator_exact_under_skew(world, rows, hidden, dtype, seed, skew, grid):
    # every rank: bytes of the exact reference, of the unfused chain, and float64 within 1 ulp
    assert check_sim.check(world, rows, hidden, dtype, seed, skew, grid) == []


@pytest.mark.parametrize("world,hidden", [(2, 2880), (4, 2880), (4, 6144)])
def test_sm90_kernels_follow_the_targets_thread_mapping(world, hidden):
    """On sm_90's kernels (384 threads a row at H = 2880, the shipped norm kernels' mapping
    there) the example still gives the unfused chain's bytes and the exact reference's,
    with the reference summing in the order of the variant the launch runs."""
    import peerdsl.sim
    assert check_sim.check(world, 3, hidden, torch.bfloat16, 1, [0, 90, 20, 0][:world], 2,
                           target="sm_90") == []
    expected = 384 if hidden == 2880 else 256
    asked = {"T": torch.bfloat16, "H": hidden, "W": world}
    got = peerdsl.sim.run(world, lambda comm: comm.launch_constexprs("ar_bias_rmsnorm", asked),
                          target="sm_90")
    assert all(c["B"] == expected and c["T"] == "bf16" for c in got)
    assert peerdsl.sim.run(2, lambda comm: comm.launch_constexprs(
        "ar_bias_rmsnorm", {"T": "f16", "H": 2880, "W": 2}))[0]["B"] == 256  # gfx1250
    # constexprs that pick several variants raise, as the GPU's manifest lookup does
    # (falling back to the kernel's B = 256 would misstate the 384 every variant has here)
    from peerdsl.runtime.manifest import ManifestError
    with pytest.raises(ManifestError, match=r"match \d+ registered variants.*name more of.*'W'"):
        peerdsl.sim.run(2, lambda comm: comm.launch_constexprs(
            "ar_bias_rmsnorm", {"T": "bf16", "H": 2880}), target="sm_90")


def test_simulator_check_sees_a_wrong_result(monkeypatch):
    """The check is not vacuous: a launch that drops the bias fails it on every rank."""
    real = check_sim.host.ar_bias_rmsnorm
    monkeypatch.setattr(check_sim.host, "ar_bias_rmsnorm",
                        lambda comm, x, bias, *a: real(comm, x, torch.zeros_like(bias), *a))
    failures = check_sim.check(2, 2, 4096, torch.bfloat16, 0, [0, 100], 2)
    assert any("rank 0: out == exact" in f for f in failures)
    assert any("rank 1: residual_out == unfused" in f for f in failures)


def test_exact_reference_follows_the_block_sum_order():
    """reference.exact is bitwise the contract; a plain f32 row sum of squares is not (for
    some row), so the order emulation is what makes the simulator check exact."""
    xs, residuals, bias, weight = ref.make_inputs(2, 64, 6144, torch.bfloat16, 9)
    s = ref.biased_sum(xs, bias, residuals[0])
    blocked = ref.block_sum_of_squares(s)
    assert torch.allclose(blocked.double(), (s.double() ** 2).sum(-1), rtol=1e-5)
    assert not torch.equal(blocked, (s * s).sum(-1))


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PEERDSL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("cx", [{"T": "bf16", "H": 6144, "W": 4},
                                {"T": "f16", "H": 8192, "W": 8}])
def test_gfx1250_build(fresh_cache, cx):
    k = check_build.compile_dsl("gfx1250", **cx)
    assert not k.cached and k.code[:4] == b"\x7fELF"
    side = check_build.amd_side(k.code, k.isa, k.name)
    assert side["mach"] == hex(0x49)  # EF_AMDGPU_MACH gfx1250
    assert side["scratch bytes"] == 0 and side["spills"] == 0
    assert 0 < side["VGPRs"] <= 512 and 0 < side["SGPRs"] <= 106
    # dsl.block_sum's 32 f32 partials and the Signal's per-barrier verdicts (2 x 8 i32)
    assert side["LDS bytes"] == 32 * 4 + 2 * 8 * 4
    assert side["global loads|global_load_b128"] > 0 and side["global stores|global_store_b128"] > 0  # 16-byte packs
    assert side["barriers"] > 0 and side["atomics"] > 0  # the block reduction, the Signal
    assert k.block_size == 256
    names = [a["name"] for a in k.args]
    assert names[:6] == ["inp", "bias", "residual", "weight", "out", "residual_out"]
    assert names[6:14] == [f"sig_{i}" for i in range(8)] and names[14:] == ["rank", "rows", "eps", "call"]
    assert k.args[-1].get("role") == "call_id"  # the runtime fills it


@pytest.mark.skipif(check_build.find_clang() is None,
                    reason="clang++-22 is not installed (apt-get install clang-22 lld-22; or set "
                           "PEERDSL_CLANG): the HIP twin's gfx1250 build cannot run")
def test_hip_twin_builds_for_gfx1250(tmp_path):
    hsaco, isa = check_build.compile_hip(tmp_path, "gfx1250")
    code = hsaco.read_bytes()
    for H in (2880, 4096, 6144, 8192):
        for W in (2, 4, 8):
            side = check_build.amd_side(code, isa, f"ar_bias_rmsnorm_bf16_h{H}_w{W}")
            assert side["mach"] == hex(0x49)
            assert side["scratch bytes"] == 0 and side["spills"] == 0
            assert side["LDS bytes"] == 32 * 4 and side["global loads|global_load_b128"] > 0


def test_inputs_recipe_gives_the_kernel_bytes_on_the_simulator():
    """compare --run's recipe: its arguments, launched on the simulator, give its expected
    bytes on every rank (so a DSL/HIP mismatch on the GPU is the kernels', not the recipe's)."""
    import peerdsl.sim
    recipe = _load("inputs").inputs(2, {"T": "bf16", "H": 2880}, rows=3, device="cpu")
    assert recipe["outputs"] == ["out", "residual_out"] and recipe["work"] == 3

    def body(comm):
        a = recipe["args"][comm.rank]
        return check_sim.host.ar_bias_rmsnorm(comm, a["inp"][comm.rank], a["bias"],
                                              a["residual"], a["weight"], a["eps"], 2)

    for rank, got in enumerate(peerdsl.sim.run(2, body, seed=5, skew=[0, 250])):
        want = recipe["expected"][rank]
        assert ref.same_bytes(got[0], want["out"]) and ref.same_bytes(got[1], want["residual_out"])


def test_gpu_script_parses_its_arguments():
    p = subprocess.run([sys.executable, str(EXAMPLE / "run_gpu.py"), "--help"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "--tp" in p.stdout and "--build" in p.stdout
