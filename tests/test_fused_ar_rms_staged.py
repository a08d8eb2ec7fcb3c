"""The fused one-stage kernel with one barrier (ops/fused_ar_rms_staged.py): the bytes of the
all-reduce followed by add_rmsnorm (plain, FP8 + mirror, gemma), every rank identical, under
skew; back to back with grids that change and V rows per iteration, between LL and staged
all-reduces (the same launch epoch); plain and prepared calls take it where dispatch asks and
it is built (sm_90, W 2 and 4), others keep the one-stage kernel."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import get_target
from peerdsl.ops.registry import load_all
from fused_compare import record_launches, result_tensors, same_bytes
from reference import norm_case

SMALL = dict(spin_limit=3000)
ON = str(4 << 20)


@pytest.fixture
def fused_staged(monkeypatch):
    for k in ("PEERDSL_FUSED_PATH", "PEERDSL_LL_MAX_BYTES", "PEERDSL_STAGED_MAX_BYTES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PEERDSL_FUSED_STAGED_MAX_BYTES", ON)
    return monkeypatch


@pytest.mark.parametrize("world,hidden,rows", [(2, 2880, 5), (4, 4096, 3), (2, 6144, 1)])
@pytest.mark.parametrize("options", [{}, {"fp8_out": True, "bf16_mirror": True},
                                     {"gemma_norm": True}])
def test_it_gives_the_unfused_bytes(fused_staged, world, hidden, rows, options):
    fused_staged.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x = norm_case(rows, hidden, 31 + comm.rank)[0]
        residual, weight = norm_case(rows, hidden, 30)[1:]
        launched = record_launches(comm)
        one = comm.fused_allreduce_rmsnorm(x, residual, weight, **options)
        assert comm.last_path == "fused_1stage" and launched == ["fused_ar_rms_staged"]
        two = comm.add_rmsnorm(comm.all_reduce(x), residual, weight, **options)
        third = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **options)()
        return result_tensors(one), result_tensors(two), result_tensors(third)

    skew = lambda i: [0, 50 * (i % 3), 20, 90][:world]  # noqa: E731
    results = peerdsl.sim.run(world, body, seed=3, skew=skew, target="sm_90", **SMALL)
    for one, two, third in results:
        assert same_bytes(one, two) and same_bytes(one, third)
    assert all(same_bytes(results[0][0], r[0]) for r in results)


@pytest.mark.parametrize("world", [2, 4])
def test_back_to_back_between_ll_and_staged_all_reduces(fused_staged, world):
    """Row counts that change the grid and V (1, 9, 2, 6, 4 rows at 2880 on a grid of at most
    4 blocks), each call followed by an LL or a staged all-reduce: all on one launch epoch."""
    fused_staged.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
    fused_staged.setenv("PEERDSL_LL_MAX_BYTES", str(8 << 10))
    fused_staged.setenv("PEERDSL_STAGED_MAX_BYTES", ON)

    def body(comm):
        comm.max_grid = 4
        launched = record_launches(comm)
        ok = True
        for step, rows in enumerate((1, 9, 2, 6, 4)):
            x, residual, weight = norm_case(rows, 2880, 100 * step + comm.rank)
            got = comm.fused_allreduce_rmsnorm(x, residual, weight)
            got2 = comm.fused_allreduce_rmsnorm(x, residual, weight)  # back to back
            y = norm_case(1 + 2 * (step % 2), 2880, 7 + step + comm.rank)[0]  # LL, staged
            ok &= torch.equal(comm.all_reduce(y), sum(t.float() for t in comm.exchange(y))
                              .to(torch.bfloat16)) or comm.world > 2
            want = comm.add_rmsnorm(comm.all_reduce(x), residual, weight)
            ok &= same_bytes(result_tensors(got), result_tensors(want)) and same_bytes(result_tensors(got2), result_tensors(want))
        return ok, launched

    res = peerdsl.sim.run(world, body, seed=11, target="sm_90", **SMALL,
                          skew=lambda i: [(i * 37 * r) % 101 for r in range(world)])
    assert all(ok for ok, _ in res)
    launched = res[0][1]
    assert launched.count("fused_ar_rms_staged") == 10
    assert {"allreduce_ll", "allreduce_staged"} <= set(launched), launched


def test_sm90_builds_it_for_two_and_four_ranks_and_amd_none():
    op = load_all()["fused_ar_rms_staged"]
    sm90 = op.variants(get_target("sm_90"))
    assert {(v["H"], v["W"]) for v in sm90} == {(h, w) for h in (2880, 4096, 6144, 7168, 8192)
                                               for w in (2, 4)}
    for arch in ("gfx1250", "gfx950", "gfx942"):
        assert op.variants(get_target(arch)) == []


@pytest.mark.parametrize("world,runtime_h,staged", [(8, False, ON), (2, True, ON), (2, False, "0")])
def test_where_it_is_not_built_or_not_asked_the_one_stage_kernel_runs(fused_staged, world,
                                                                      runtime_h, staged):
    fused_staged.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
    fused_staged.setenv("PEERDSL_FUSED_STAGED_MAX_BYTES", staged)

    def body(comm):
        comm.force_runtime_h = runtime_h
        launched = record_launches(comm)
        x, residual, weight = norm_case(1, 2880, comm.rank)
        comm.fused_allreduce_rmsnorm(x, residual, weight)
        return launched

    want = "fused_ar_rms_1stage_runtime_h" if runtime_h else "fused_ar_rms_1stage"
    assert peerdsl.sim.run(world, body, seed=1, target="sm_90", **SMALL) == [[want]] * world
