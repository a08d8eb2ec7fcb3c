"""The norm kernels' R constexpr (ops/_rows.py residual_norm_row `ahead`): how many packs of
a row are read before any is stored, chosen per target (lowering/targets.py
`row_reads_ahead`: 1 on AMD, 4 on sm_90; 0 = the whole row). Every R gives the same bytes, and
each target builds exactly its own R, so the runtime's lookups (which never name R) match one
kernel."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import get_target
from peerdsl.ops.registry import load_all
from reference import norm_case, norm_outputs

BF16 = torch.bfloat16
NORM_OPS = ("add_rmsnorm", "add_rmsnorm_runtime_h", "fused_ar_rms_1stage",
            "fused_ar_rms_1stage_runtime_h", "fused_ar_rms_2stage", "fused_ar_rms_2stage_runtime_h")


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("arch,want", [("gfx1250", 1), ("gfx942", 1), ("sm_90", 4)])
def test_each_target_builds_one_r(arch, want):
    target = get_target(arch)
    ops = load_all()
    for op in NORM_OPS:
        rs = {v["R"] for v in ops[op].variants(target)}
        assert rs == {want}, (op, arch, rs)


@pytest.mark.parametrize("op,size", [("fused_ar_rms_1stage", {"H": 2880}),
                                     ("fused_ar_rms_1stage_runtime_h", {"MAXH": 8192}),
                                     ("fused_ar_rms_2stage", {"H": 6144})])
@pytest.mark.parametrize("flags", [0, 2 | 4])  # plain; FP8 with the T mirror
def test_every_r_gives_the_same_bytes(op, size, flags):
    rows, world = 3, 2
    hidden = size.get("H", 5120)

    def body(comm):
        x, residual, weight = norm_case(rows, hidden, 11 + comm.rank)
        results = []
        for R in (1, 0, 2, 4):
            outs = norm_outputs(rows, hidden)
            args = dict(inp=x, residual=residual, weight=weight, sig=comm.signal,
                        rank=comm.rank, rows=rows, eps=1e-6, flags=flags, **outs)
            if "runtime_h" in op:
                args["hidden"] = hidden
            if "2stage" in op:
                args["staging"] = comm.peer_buffer((rows * hidden,), BF16)
            comm.launch(op, grid=2, constexprs={"T": "bf16", **size, "W": world,
                                                "FP8": "e4m3fn", "R": R}, **args)
            results.append(outs)
        return all(_same(results[0][k], r[k]) for r in results[1:] for k in results[0])

    assert peerdsl.sim.run(world, body, seed=2, skew=lambda i: [0, 40 * (i % 3)]) == [True] * world
