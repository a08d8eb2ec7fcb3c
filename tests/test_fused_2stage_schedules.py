"""The fused two-stage kernel's schedules (ops/fused_ar_rms_2stage.py U, V, E): every one
gives the bytes of the default schedule, under skew, with row counts that leave partial
iterations (rows not a multiple of grid x V, block work not a multiple of 256 x U), and each
target builds exactly the schedules dispatch may pick."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import get_target
from peerdsl.ops.registry import load_all
from peerdsl.runtime import dispatch

BF16 = torch.bfloat16
SCHEDULES = [dict(U=0, V=1, E=1), dict(U=1, V=1, E=0), dict(U=2, V=2, E=1),
             dict(U=4, V=2, E=0), dict(U=4, V=3, E=1)]


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("op,size,hidden,world", [
    ("fused_ar_rms_2stage", {"H": 2880}, 2880, 4),
    ("fused_ar_rms_2stage", {"H": 6144}, 6144, 2),
    ("fused_ar_rms_2stage_runtime_h", {"MAXH": 8192}, 5120, 4)])
@pytest.mark.parametrize("flags", [0, 2 | 4])  # plain; FP8 with the T mirror
def test_every_schedule_gives_the_same_bytes(op, size, hidden, world, flags):
    rows, grid = 7, 2

    def body(comm):
        g = torch.Generator().manual_seed(5 + comm.rank)
        x = torch.randn(rows, hidden, generator=g).to(BF16)
        residual = torch.randn(rows, hidden, generator=g).to(BF16)
        weight = (torch.rand(hidden, generator=g) + 0.5).to(BF16)
        results = []
        for sched in SCHEDULES:
            outs = dict(out=torch.zeros(rows, hidden, dtype=BF16),
                        residual_out=torch.zeros(rows, hidden, dtype=BF16),
                        q=torch.zeros(rows, hidden, dtype=torch.int8),
                        scale=torch.zeros(rows, dtype=torch.float32))
            args = dict(inp=x, residual=residual, weight=weight, sig=comm.signal,
                        rank=comm.rank, rows=rows, eps=1e-6, flags=flags,
                        staging=comm.peer_buffer((rows * hidden,), BF16), **outs)
            if "runtime_h" in op:
                args["hidden"] = hidden
            comm.launch(op, grid=grid, constexprs={"T": "bf16", **size, "W": world,
                                                   "FP8": "e4m3fn", "R": 1, **sched}, **args)
            results.append(outs)
        return all(_same(results[0][k], r[k]) for r in results[1:] for k in results[0])

    skew = lambda i: [0, 30 * (i % 3), 0, 60][: world]  # noqa: E731
    assert peerdsl.sim.run(world, body, seed=3, skew=skew) == [True] * world


@pytest.mark.parametrize("arch", ["gfx1250", "gfx950", "gfx942"])
def test_amd_targets_build_the_default_schedule_only(arch):
    ops = load_all()
    for op in ("fused_ar_rms_2stage", "fused_ar_rms_2stage_runtime_h"):
        for v in ops[op].variants(get_target(arch)):
            assert not {"U", "V", "E"} & set(v), (arch, op, v)


def test_sm90_builds_every_schedule_dispatch_picks():
    ops = load_all()
    for op, key in (("fused_ar_rms_2stage", "H"), ("fused_ar_rms_2stage_runtime_h", "MAXH")):
        built = {(v[key], v["W"], v["U"], v["V"], v["E"])
                 for v in ops[op].variants(get_target("sm_90"))}
        for size, world, *_ in built:
            cx = dispatch.fused_2stage_kernel("sm_90", world, size)
            assert (size, world, cx["U"], cx["V"], cx["E"]) in built
    assert dispatch.fused_2stage_kernel("sm_90", 4, 8192)["V"] == 1  # two rows would spill
    assert dispatch.fused_2stage_kernel("sm_90", 8, 6144) == {"U": 0, "V": 1, "E": 1}


@pytest.mark.parametrize("W", [2, 4, 8])
def test_sm90_schedules_dispatch_picks_do_not_spill(W):
    """What dispatch can launch on sm_90 compiles without spills or local memory (the one
    known exception: the default schedule's 8 bytes at W=8, H=7168, MAXH 16384)."""
    import peerdsl
    ops = load_all()
    for op, key, sizes in (("fused_ar_rms_2stage", "H", (2880, 6144, 8192)),
                           ("fused_ar_rms_2stage_runtime_h", "MAXH", (4096, 8192))):
        for size in sizes:
            if key == "H" and (size // 8) % W:
                continue
            cx = dispatch.fused_2stage_kernel("sm_90", W, size)
            ck = peerdsl.compile(ops[op].kernel, "sm_90", T="bf16", **{key: size}, W=W,
                                 FP8="e4m3fn", R=4, **cx)
            r = ck.resources
            assert r["spill_stores"] == 0 and r["local_bytes"] == 0, (op, size, W, cx, r)
    assert dispatch.fused_2stage_kernel("gfx1250", 4, 6144) == {}
