"""The fused one-stage kernel with V rows per block iteration (ops/fused_ar_rms_1stage.py
`fused_ar_rms_1stage_rows`): the bytes of the plain kernel under skew, with row counts that
leave partial iterations; sm_90 builds exactly the (H, W) dispatch may ask for, AMD none;
and the communicator takes it only where rows outnumber its blocks."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import get_target
from peerdsl.ops.fused_ar_rms_1stage import ROWS_FIT, rows_in_flight
from peerdsl.ops.registry import load_all
from peerdsl.runtime import dispatch
from peerdsl.runtime.built import from_registry
from peerdsl.runtime.fused_launch import fused_kernel
from reference import norm_case, norm_outputs


def _same(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("hidden,world,rows,grid,v", [(2880, 4, 7, 2, 2), (2880, 2, 9, 2, 4),
                                                      (6144, 2, 5, 2, 2), (4096, 4, 3, 3, 2)])
@pytest.mark.parametrize("flags", [0, 2 | 4])  # plain; FP8 with the T mirror
def test_rows_kernel_gives_the_plain_kernels_bytes(hidden, world, rows, grid, v, flags):
    def body(comm):
        x, residual, weight = norm_case(rows, hidden, 11 + comm.rank)
        results = []
        for op, extra in (("fused_ar_rms_1stage", {"R": 4}), ("fused_ar_rms_1stage_rows",
                                                             {"V": v})):
            outs = norm_outputs(rows, hidden)
            comm.launch(op, grid=grid, constexprs={"T": "bf16", "H": hidden, "W": world,
                                                   "FP8": "e4m3fn", **extra},
                        inp=x, residual=residual, weight=weight, sig=comm.signal,
                        rank=comm.rank, rows=rows, eps=1e-6, flags=flags, **outs)
            results.append(outs)
        return all(_same(results[0][k], results[1][k]) for k in results[0])

    skew = lambda i: [0, 40 * (i % 3), 0, 70][:world]  # noqa: E731
    assert peerdsl.sim.run(world, body, seed=5, skew=skew) == [True] * world


def test_sm90_builds_what_dispatch_asks_for_and_amd_none(monkeypatch):
    op = load_all()["fused_ar_rms_1stage_rows"]
    built = {(v["H"], v["W"], v["V"]) for v in op.variants(get_target("sm_90"))}
    assert built == {(h, w, v) for (h, w), vs in ROWS_FIT.items() for v in vs}
    for arch in ("gfx1250", "gfx950", "gfx942"):
        assert op.variants(get_target(arch)) == []
    for h in (2880, 4096, 6144, 7168, 8192):
        for w in (2, 4, 8):
            for rows in (34, 64, 66, 67, 100, 256, 4096):
                v = dispatch.fused_1stage_rows("sm_90", w, rows, h, 33)
                assert v == 1 or (h, w, v) in built
                # TP2 only: at TP4 the plain kernel was faster (kernel_variants.py)
                assert v > 1 if rows_in_flight(h, w) and w == 2 else v == 1
            assert dispatch.fused_1stage_rows("sm_90", w, 33, h, 33) == 1  # one row a block
            assert dispatch.fused_1stage_rows("gfx1250", w, 64, h, 33) == 1
    # the smallest V covering the rows up to the target's cap for the world (2 at TP2 on
    # sm_90, none at TP4), else the largest of those
    assert [dispatch.fused_1stage_rows("sm_90", 2, r, 2880, 33) for r in (60, 67, 200)] == \
        [2, 2, 2]
    assert dispatch.fused_1stage_rows("sm_90", 2, 200, 6144, 33) == 2
    assert dispatch.fused_1stage_rows("sm_90", 4, 200, 6144, 33) == 1
    monkeypatch.setitem(dispatch.FUSED_1STAGE_ROWS, "sm_90", {2: 4, 4: 4})
    for w in (2, 4):
        assert [dispatch.fused_1stage_rows("sm_90", w, r, 2880, 33) for r in (60, 67, 200)] \
            == [2, 4, 4]


def test_rows_override(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_1STAGE_ROWS", "1")
    assert dispatch.fused_1stage_rows("sm_90", 4, 64, 6144, 33) == 1
    monkeypatch.setenv("PEERDSL_FUSED_1STAGE_ROWS", "2")
    assert dispatch.fused_1stage_rows("sm_90", 4, 8, 6144, 33) == 2  # forced below the grid
    with pytest.raises(ValueError, match=r"ROWS=2.*V in \[1\] .*H=7168, W=4"):
        dispatch.fused_1stage_rows("sm_90", 4, 64, 7168, 33)
    monkeypatch.setenv("PEERDSL_FUSED_1STAGE_ROWS", "4")
    with pytest.raises(ValueError, match=r"V in \[1, 2\] .*H=6144"):
        dispatch.fused_1stage_rows("sm_90", 4, 64, 6144, 33)
    assert dispatch.fused_1stage_rows("sm_90", 4, 64, 2880, 33) == 4  # built, not the default
    with pytest.raises(ValueError, match=r"V in \[1\] .*gfx1250"):  # AMD builds none
        dispatch.fused_1stage_rows("gfx1250", 4, 64, 2880, 33)


def test_communicator_launches_the_rows_kernel_where_asked(monkeypatch):
    """On the simulator (gfx1250: nothing built) the plain kernel; the choice and the grid
    of a build that has the rows kernel, through the communicator's own planning."""
    def body(comm):
        plain = fused_kernel(comm, "fused_1stage", 64, 6144, "bf16")
        comm.built = from_registry("sm_90")
        comm.arch = "sm_90"
        comm.max_grid = 33
        rows = fused_kernel(comm, "fused_1stage", 64, 6144, "bf16")
        few = fused_kernel(comm, "fused_1stage", 20, 6144, "bf16")
        return plain[1:], rows[1:], few[1:]

    for plain, rows, few in peerdsl.sim.run(2, body):  # TP2: sm_90 takes V = 2 there
        assert plain[0] == "fused_ar_rms_1stage" and "V" not in plain[1]
        assert rows[0] == "fused_ar_rms_1stage_rows" and rows[1]["V"] == 2 and rows[2] == 32
        assert few[0] == "fused_ar_rms_1stage" and few[2] == 20

