"""The ll+rmsnorm path in one launch (ops/fused_ar_rms_ll.py): the bytes of the LL
all-reduce followed by add_rmsnorm, every rank identical, under skew and with grids that
change between calls; plain and prepared calls take it where it is built (sm_90), AMD
targets build none and keep the two launches."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import get_target
from peerdsl.ops.registry import load_all
from reference import norm_case

SMALL = dict(spin_limit=3000)


def _bytes(t):
    return None if t is None else t.contiguous().view(torch.uint8)


def _same(a, b):
    return all((x is None and y is None) or (x is not None and y is not None and x.shape == y.shape
                                             and torch.equal(_bytes(x), _bytes(y)))
               for x, y in zip(a, b))


def _record_launches(comm):
    """The names of the kernels comm launches from now on (a list filled as it goes)."""
    names, launch = [], comm._launch

    def recording(name, *args, **kwargs):
        names.append(name)
        return launch(name, *args, **kwargs)
    comm._launch = recording
    return names


def _result(r):
    return (r.out, r.residual_out, r.q, r.scale)


@pytest.mark.parametrize("world,hidden,rows", [(2, 2880, 5), (4, 4096, 3), (2, 6144, 1),
                                             (4, 7168, 6)])
@pytest.mark.parametrize("options", [{}, {"fp8_out": True, "bf16_mirror": True},
                                     {"gemma_norm": True}])
def test_one_launch_gives_the_two_launches_bytes(monkeypatch, world, hidden, rows, options):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "ll+rmsnorm")

    def body(comm):
        x = norm_case(rows, hidden, 31 + comm.rank)[0]
        residual, weight = norm_case(rows, hidden, 30)[1:]  # replicated, as in serving
        launched = _record_launches(comm)
        one = comm.fused_allreduce_rmsnorm(x, residual, weight, **options)
        assert comm.last_path == "ll+rmsnorm" and launched == ["fused_ar_rms_ll"]
        ar = comm.all_reduce(x)
        assert comm.last_path == "ll"
        two = comm.add_rmsnorm(ar, residual, weight, **options)
        third = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **options)()
        return _result(one), _result(two), _result(third)

    skew = lambda i: [0, 50 * (i % 3), 20, 90][:world]  # noqa: E731
    results = peerdsl.sim.run(world, body, seed=3, skew=skew, target="sm_90", **SMALL)
    for one, two, third in results:
        assert _same(one, two) and _same(one, third)
    assert all(_same(results[0][0], r[0]) for r in results)  # every rank the same bytes


def test_grids_that_change_between_calls_never_accept_a_stale_line(monkeypatch):
    """One block a row: 1, 4, 2, 7, 3 rows alternate the grid, interleaved with LL
    all-reduces of other grids, on one LL epoch."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "ll+rmsnorm")
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", str(1 << 20))

    def body(comm):
        ok = True
        for step, rows in enumerate((1, 4, 2, 7, 3)):
            x, residual, weight = norm_case(rows, 2880, 100 * step + comm.rank)
            got = comm.fused_allreduce_rmsnorm(x, residual, weight)
            want = comm.add_rmsnorm(comm.all_reduce(x), residual, weight)
            ok &= _same(_result(got), _result(want))
            y = norm_case(3 * step + 1, 2880, 7 + step + comm.rank)[0]
            ok &= torch.equal(comm.all_reduce(y), sum(t.float() for t in comm.exchange(y))
                              .to(torch.bfloat16)) or comm.world > 2
        return ok

    assert peerdsl.sim.run(2, body, seed=9, skew=lambda i: [0, 60 * (i % 2)], target="sm_90",
                           **SMALL) == [True, True]


def test_sm90_builds_it_and_amd_none():
    op = load_all()["fused_ar_rms_ll"]
    sm90 = op.variants(get_target("sm_90"))
    assert {(v["H"], v["W"]) for v in sm90} == {(h, w) for h in (2880, 4096, 6144, 7168, 8192)
                                               for w in (2, 4)}
    for arch in ("gfx1250", "gfx950", "gfx942"):
        assert op.variants(get_target(arch)) == []


def test_forced_runtime_h_keeps_the_two_launches(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "ll+rmsnorm")

    def body(comm):
        comm.force_runtime_h = True
        launched = _record_launches(comm)
        x, residual, weight = norm_case(2, 6144, comm.rank)
        comm.fused_allreduce_rmsnorm(x, residual, weight)
        return launched

    assert peerdsl.sim.run(2, body, seed=1, target="sm_90", **SMALL) == \
        [["allreduce_ll", "add_rmsnorm_runtime_h"]] * 2
