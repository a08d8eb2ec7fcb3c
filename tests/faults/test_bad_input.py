"""Bad input (issue 14 items 6 and 8): empty inputs return empty results of the right shapes
and dtypes without a launch or a pool write; every check runs before the first launch or pool
write; an unbuilt world size fails when the communicator (or the simulator job) is made, an
unbuilt hidden size before any launch, each naming the sizes that are built."""
from __future__ import annotations

import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))  # tests/: reference, fakes

import peerdsl.sim  # noqa: E402
from peerdsl.runtime import communicator as cm  # noqa: E402
from peerdsl.runtime.built import Built, from_manifest, from_registry  # noqa: E402
from peerdsl.runtime.sim.collective_comm import SimCollectiveComm  # noqa: E402
from reference import all_reduce_ref  # noqa: E402

H = 2880
BF16 = torch.bfloat16


@pytest.fixture
def device_work(monkeypatch):
    """Every launch and every registered-pool write of the simulator's communicator."""
    log: list = []
    launch, stage = SimCollectiveComm._launch, SimCollectiveComm._stage

    def logged_launch(self, name, *a, **k):
        log.append(("launch", self.rank, name))
        return launch(self, name, *a, **k)

    def logged_stage(self, t):
        log.append(("stage", self.rank, tuple(t.shape)))
        return stage(self, t)

    monkeypatch.setattr(SimCollectiveComm, "_launch", logged_launch)
    monkeypatch.setattr(SimCollectiveComm, "_stage", logged_stage)
    return log


def norm_inputs(rows: int, dtype=BF16):
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, H, generator=g).to(dtype),
            torch.randn(rows, H, generator=g).to(dtype), torch.ones(H, dtype=dtype))


@pytest.mark.parametrize("fp8,mirror", [(False, False), (True, False), (True, True)])
def test_zero_rows_give_empty_results_without_a_launch(device_work, fp8, mirror):
    x, res, w = norm_inputs(0)

    def body(comm):
        out = {"fused": comm.fused_allreduce_rmsnorm(x, res, w, fp8_out=fp8, bf16_mirror=mirror),
               "add": comm.add_rmsnorm(x, res, w, fp8_out=fp8, bf16_mirror=mirror),
               "quant": comm.per_token_quant_fp8(x),
               "ar": comm.all_reduce(x), "ar 1d": comm.all_reduce(torch.empty(0, dtype=BF16)),
               "ag": comm.all_gather(x)}
        assert comm.last_path == "empty"
        return out

    for got in peerdsl.sim.run(2, body, seed=1):
        for key in ("fused", "add"):
            r = got[key]
            assert tuple(r.residual_out.shape) == (0, H) and r.residual_out.dtype == BF16
            if fp8:
                assert r.out is None and r.q.dtype == torch.float8_e4m3fn
                assert tuple(r.q.shape) == (0, H) and tuple(r.scale.shape) == (0, 1)
                assert r.scale.dtype == torch.float32
                assert (r.mirror is not None) == mirror
                if mirror:
                    assert tuple(r.mirror.shape) == (0, H) and r.mirror.dtype == BF16
            else:
                assert tuple(r.out.shape) == (0, H) and r.out.dtype == BF16 and r.q is None
            assert len(list(r)) == (3 + mirror if fp8 else 2)  # unpacks like a full result
        q, scale = got["quant"]
        assert tuple(q.shape) == (0, H) and q.dtype == torch.float8_e4m3fn
        assert tuple(scale.shape) == (0, 1) and scale.dtype == torch.float32
        assert tuple(got["ar"].shape) == (0, H) and got["ar"].dtype == BF16
        assert tuple(got["ar 1d"].shape) == (0,)
        assert tuple(got["ag"].shape) == (2, 0, H)
    assert device_work == []


def test_an_empty_call_leaves_the_ranks_in_step(device_work):
    """Every rank skips the empty call alike; the next collective is exact."""
    xs = [torch.randn(16, H).to(BF16) for _ in range(2)]
    _, res, w = norm_inputs(16)
    empty, eres, ew = norm_inputs(0)

    def body(comm):
        comm.fused_allreduce_rmsnorm(empty, eres, ew)
        comm.all_reduce(empty)
        return comm.all_reduce(xs[comm.rank]), comm.fused_allreduce_rmsnorm(xs[comm.rank], res, w)

    outs = peerdsl.sim.run(2, body, seed=2)
    for ar, _ in outs:
        assert torch.equal(ar, all_reduce_ref(xs))
    assert {name for kind, _, name in device_work if kind == "launch"}  # the real calls ran


def test_every_check_runs_before_a_launch_or_a_pool_write(device_work):
    x, res, w = norm_inputs(4)

    def body(comm):
        errors = []
        for call in (
            lambda: comm.fused_allreduce_rmsnorm(x, res.to("meta"), w),   # another device
            lambda: comm.fused_allreduce_rmsnorm(x, res, w.to("meta")),
            lambda: comm.fused_allreduce_rmsnorm(x, res, w, eps="tiny"),  # not a number
            lambda: comm.add_rmsnorm(x, res, w, eps=None),
            lambda: comm.fused_allreduce_rmsnorm(x[:0, :1004], res[:0, :1004], w[:1004]),
            lambda: comm.per_token_quant_fp8(torch.zeros(0, 1004, dtype=BF16)),
        ):
            try:
                call()
            except (TypeError, ValueError) as e:
                errors.append(str(e))
        return errors

    errors = peerdsl.sim.run(2, body)[0]
    assert len(errors) == 6
    assert "residual is on meta" in errors[0] and "weight is on meta" in errors[1]
    assert "tiny" in errors[2]
    # an empty input with an unsupported hidden size is still an error, naming the rule
    assert "hidden size 1004" in errors[4] and "multiple of 8 in [256, 16384]" in errors[4]
    assert "per_token_quant_fp8" in errors[5]
    assert device_work == []


@pytest.mark.parametrize("world", [3, 5, 6, 7])
def test_simulator_job_rejects_an_unbuilt_world(world):
    with pytest.raises(ValueError) as e:
        peerdsl.sim.run(world, lambda comm: comm.all_reduce(torch.ones(8, dtype=BF16)))
    msg = str(e.value)
    assert f"world size {world} is not built" in msg and "[2, 4, 8]" in msg
    assert "WORLDS" in msg


def test_simulator_plain_communicator_takes_any_world():
    """The kernel-level SimCommunicator (user kernels, no collectives) has no such limit."""
    got = peerdsl.sim.run(3, lambda comm: comm.exchange(comm.rank),
                          comm_cls=peerdsl.sim.SimCommunicator)
    assert got == [[0, 1, 2]] * 3


def test_unbuilt_hidden_names_the_built_list_of_this_communicator(device_work):
    """The entry points check the communicator's own built list (on a GPU: its manifest)."""
    reg = from_registry("gfx1250")
    only_4096 = Built("gfx1250", "manifest test/manifest.json",  # and no runtime-H kernels
                      {op: tuple(c for c in cs if c.get("H", 4096) == 4096)
                       for op, cs in reg.variants.items() if not op.endswith("_runtime_h")},
                      "rebuild it")
    x, res, w = norm_inputs(2)

    def body(comm):
        comm.built = only_4096
        with pytest.raises(ValueError) as e:
            comm.fused_allreduce_rmsnorm(x, res, w)
        return str(e.value)

    msg = peerdsl.sim.run(2, body)[0]
    assert "hidden size 2880 is not built for fused_allreduce_rmsnorm" in msg
    assert "[4096]" in msg and "test/manifest.json" in msg
    assert device_work == []


# ----------------------------------------------------------------------------- GPU host side

def fake_manifest(worlds=(2, 4, 8)):
    kernels = {}
    for op, cs in from_registry("sm_90").variants.items():
        for i, c in enumerate(cs):
            if "W" not in c or c["W"] in worlds:
                kernels[f"{op}_{i}"] = types.SimpleNamespace(op=op, constexprs=c)
    return types.SimpleNamespace(fp8_format="e4m3fn", arch="sm_90",
                                 path="build/sm_90/manifest.json", kernels=kernels)


def make_gpu_comm(monkeypatch, world, manifest):
    """The GPU Communicator's constructor with torch.distributed and the driver faked; any
    allocation or exchange fails the test (the world check must come before them)."""
    fake_dist = types.SimpleNamespace(get_rank=lambda g=None: 0, get_world_size=lambda g=None: world)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist)
    monkeypatch.setattr(torch, "distributed", fake_dist, raising=False)
    monkeypatch.setattr(cm, "_arch_of", lambda d: "sm_90")
    loader = types.SimpleNamespace(manifest=manifest)
    monkeypatch.setattr(cm.Communicator, "_make_loader", staticmethod(lambda m: loader))

    def too_far(*a, **k):
        raise AssertionError("the communicator went past the world check")

    monkeypatch.setattr(torch.cuda, "get_device_properties", too_far)
    monkeypatch.setattr(cm.Communicator, "_share_ipc", too_far)
    return cm.Communicator(device="cpu", build_dir="build")


@pytest.mark.parametrize("world", [3, 5])
def test_gpu_communicator_rejects_an_unbuilt_world_before_allocating(monkeypatch, world):
    with pytest.raises(ValueError) as e:
        make_gpu_comm(monkeypatch, world, fake_manifest())
    msg = str(e.value)
    assert f"world size {world} is not built for sm_90" in msg and "[2, 4, 8]" in msg
    assert "build/sm_90/manifest.json" in msg
    assert "peerdsl build --arch sm_90 --ops all -o build" in msg


def test_gpu_communicator_world_check_reads_the_manifest(monkeypatch):
    """A manifest built for worlds 2 and 8 only refuses 4, though the ops know it."""
    with pytest.raises(ValueError, match=r"world size 4 .* world sizes \[2, 8\]"):
        make_gpu_comm(monkeypatch, 4, fake_manifest(worlds=(2, 8)))
    with pytest.raises(AssertionError, match="past the world check"):  # 8 passes the check
        make_gpu_comm(monkeypatch, 8, fake_manifest(worlds=(2, 8)))


def test_built_from_manifest_lists_hidden_sizes_per_entry_point():
    m = fake_manifest()
    m.kernels = {k: e for k, e in m.kernels.items()  # nor any runtime-H add_rmsnorm
                 if not (e.op == "add_rmsnorm" and e.constexprs["H"] == 7168)
                 and e.op != "add_rmsnorm_runtime_h"}
    b = from_manifest(m)
    assert 7168 in b.hidden("per_token_quant_fp8")
    assert 7168 not in b.hidden("fused_allreduce_rmsnorm")  # its unfused paths need add_rmsnorm
    with pytest.raises(ValueError, match=r"hidden size 7168 is not built for add_rmsnorm"):
        b.check_hidden(7168, "add_rmsnorm")
