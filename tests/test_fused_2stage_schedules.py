"""The fused two-stage kernel's schedules (ops/fused_ar_rms_2stage.py U, V, E): every one
gives the bytes of the default schedule, under skew, with row counts that leave partial
iterations (rows not a multiple of grid x V, block work not a multiple of 256 x U), and each
target builds exactly the schedules dispatch may pick."""
from __future__ import annotations

import itertools

import pytest
import torch

import peerdsl.sim
from peerdsl.lowering.targets import get_target
from peerdsl.ops.registry import load_all
from peerdsl.runtime import dispatch
from reference import norm_case, norm_outputs

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
        x, residual, weight = norm_case(rows, hidden, 5 + comm.rank)
        results = []
        for sched in SCHEDULES:
            outs = norm_outputs(rows, hidden)
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


@pytest.mark.parametrize("split", [None, "0", "1"])
def test_sm90_builds_every_schedule_dispatch_picks(monkeypatch, split):
    """What dispatch asks for picks exactly one built variant, as the manifest's lookup
    matches (every key the query names, equal), with and without PEERDSL_FUSED_SPLIT."""
    if split is not None:
        monkeypatch.setenv("PEERDSL_FUSED_SPLIT", split)
    ops = load_all()
    for op, key in (("fused_ar_rms_2stage", "H"), ("fused_ar_rms_2stage_runtime_h", "MAXH")):
        built = [v for v in ops[op].variants(get_target("sm_90")) if str(v["T"]) == "bf16"]
        assert len(built) > 20
        # rows 64: a call with one row in flight where the world's schedule says so
        for (size, world), rows in itertools.product({(v[key], v["W"]) for v in built},
                                                     (None, 64)):
            threads = {v["B"] for v in built if v[key] == size}.pop()  # one B a size
            cx = dispatch.fused_2stage_kernel("sm_90", world, size, key == "MAXH", rows,
                                              threads)
            query = {key: size, "W": world, "B": threads, **cx}
            hits = [v for v in built if all(k in v and v[k] == q for k, q in query.items())]
            assert len(hits) == 1, (op, query, hits)
            want = (int(split) if split is not None
                    else dispatch.fused_2stage_splits("sm_90", world, size, key == "MAXH"))
            assert hits[0].get("S", 0) == want
    monkeypatch.delenv("PEERDSL_FUSED_SPLIT", raising=False)
    assert dispatch.fused_2stage_kernel("sm_90", 4, 8192)["V"] == 1  # two rows would spill
    assert dispatch.fused_2stage_kernel("sm_90", 8, 6144) == {"U": 0, "V": 1, "E": 1, "S": 0}
    assert dispatch.fused_2stage_kernel("sm_90", 4, 6144)["V"] == 2
    # one row in flight for a call of up to 256 rows at TP4 (call L3); the same built variant
    for rows, v in ((64, 1), (256, 1), (257, 2), (None, 2)):
        assert dispatch.fused_2stage_kernel("sm_90", 4, 6144, rows=rows)["V"] == v
    assert dispatch.fused_2stage_kernel("sm_90", 4, 6144, rows=64) == {
        "U": 4, "V": 1, "E": 0, "S": 0}
    assert dispatch.fused_2stage_kernel("sm_90", 4, 2880, rows=64)["S"] == 1  # split: V = 1
    # the specialized sizes split where calls M5, M6 and M9 timed it faster: 2880 (TP2 and
    # TP4), not 4096, 6144, 7168 (224 threads a row) nor 8192; runtime-H bounds up to 4096
    splits = {(w, h) for w in (2, 4) for h in (2880, 4096, 6144, 7168, 8192)
              if dispatch.fused_2stage_kernel("sm_90", w, h, rows=1024).get("S")}
    assert splits == {(2, 2880), (4, 2880)}
    assert [dispatch.fused_2stage_kernel("sm_90", 2, m, runtime_h=True).get("S")
            for m in (2048, 4096, 8192)] == [1, 1, 0]
    assert dispatch.fused_2stage_kernel("sm_90", 2, 6144, rows=64)["V"] == 2  # TP4 only
    # the runtime-H kernel takes the specialized kernel's schedule at its bound: one launch
    # with two rows at MAXH 6144, the whole row ahead at 8192; split only up to 4096
    for maxh, world in ((6144, 2), (6144, 4), (8192, 2), (8192, 4)):
        assert (dispatch.fused_2stage_kernel("sm_90", world, maxh, runtime_h=True)
                == dispatch.fused_2stage_kernel("sm_90", world, maxh))
    assert dispatch.fused_2stage_kernel("sm_90", 4, 6144, runtime_h=True)["V"] == 2
    assert dispatch.fused_2stage_kernel("sm_90", 4, 8192, runtime_h=True)["S"] == 0
    assert dispatch.fused_2stage_kernel("sm_90", 4, 4096, runtime_h=True)["S"] == 1
    assert dispatch.fused_2stage_kernel("sm_90", 8, 4096, runtime_h=True)["V"] == 1


@pytest.mark.parametrize("W", [2, 4, 8])
def test_sm90_schedules_dispatch_picks_do_not_spill(W):
    """What dispatch can launch on sm_90 compiles without spills or local memory (the one
    known exception: the default schedule's 8 bytes at W=8, H=7168, MAXH 16384)."""
    import peerdsl
    ops = load_all()
    for op, key, sizes in (("fused_ar_rms_2stage", "H", (2880, 6144, 8192)),
                           ("fused_ar_rms_2stage_runtime_h", "MAXH", (4096, 6144, 8192))):
        for size in sizes:
            if key == "H" and (size // 8) % W:
                continue
            built = [v for v in ops[op].variants(get_target("sm_90"))
                     if v[key] == size and v["W"] == W and str(v["T"]) == "bf16"]
            threads = built[0]["B"]
            cx = dispatch.fused_2stage_kernel("sm_90", W, size, key == "MAXH", None, threads)
            # the built variant dispatch's query names (its B and M included)
            variant, = [v for v in built if all(v[k] == q for k, q in cx.items())]
            ck = peerdsl.compile(ops[op].kernel, "sm_90", **variant)
            r = ck.resources
            assert r["spill_stores"] == 0 and r["local_bytes"] == 0, (op, size, W, cx, r)
    assert dispatch.fused_2stage_kernel("gfx1250", 4, 6144) == {}



def _fused_bytes(world, hidden, force_runtime_h, opts, rows=9):
    """Every rank's fused-entry outputs (eager, then a prepared call) as bytes, on sm_90's
    variants under skew, with the PEERDSL_* settings the caller made."""
    def body(comm):
        comm.force_runtime_h = force_runtime_h
        x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(17 + comm.rank))
        g = torch.Generator().manual_seed(5)  # residual and weight alike on every rank
        x = x.to(BF16)
        residual = torch.randn(rows, hidden, generator=g).to(BF16)
        weight = (torch.rand(hidden, generator=g) + 0.5).to(BF16)
        eager = comm.fused_allreduce_rmsnorm(x, residual, weight, **opts)
        path = comm.last_path
        prepared = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **opts)()
        return path, [[t.view(torch.uint8).clone() for t in r if t is not None]
                      for r in (eager, prepared)]
    return peerdsl.sim.run(world, body, seed=7, skew=[0, 40, 0, 90][:world], target="sm_90")


@pytest.mark.parametrize("hidden,world,force_runtime_h", [(2880, 4, False), (6144, 2, False),
                                                          (5120, 4, False), (6144, 4, True),
                                                          (10240, 4, False),
                                                          (10272, 4, False),
                                                          (16352, 4, False)])
@pytest.mark.parametrize("opts", [{}, {"fp8_out": True, "bf16_mirror": True},
                                  {"gemma_norm": True}])
def test_split_schedule_gives_the_unfused_bytes(monkeypatch, hidden, world, force_runtime_h,
                                                opts):
    """S = 1 (stage 1 alone, then ops/fused_ar_rms_gather.py as a second launch with a
    grid of its own) through the public fused entry, eager and prepared: the unfused
    path's bytes on every rank."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "unfused")
    ref = _fused_bytes(world, hidden, force_runtime_h, opts)
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_2stage")
    monkeypatch.setenv("PEERDSL_FUSED_SPLIT", "1")
    got = _fused_bytes(world, hidden, force_runtime_h, opts)
    for (ref_path, ref_out), (path, out) in zip(ref, got):
        assert (ref_path, path) == ("unfused", "fused_2stage")
        for r, o in zip(ref_out[0] + ref_out[1], out[0] + out[1]):
            assert torch.equal(r, o)
    assert all(torch.equal(a, b) for r in got for a, b in zip(r[1][0], got[0][1][0]))


def test_split_schedule_keeps_the_fault_rules(monkeypatch):
    """A rank late past the spin limit in a split fused call: its peers time out in stage
    1, the gather launch after it reads nothing (dsl.staged_ok), no call returns a wrong
    result, and every later call is refused (the harness checks all of it)."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults"))
    from fault_harness import Step, first_errors, run_case, statuses
    monkeypatch.setenv("PEERDSL_FUSED_SPLIT", "1")
    late = 3

    def before(comm, i):
        comm.delay = 400_000 if (comm.rank, i) == (late, 1) else 0
    res = run_case("sm_90 split fused, rank 3 late", 4,
                   [Step("fused", 6, hidden=2880, path="fused_2stage")] * 3, before=before,
                   target="sm_90")
    st, first = statuses(res), first_errors(res)
    assert all(s[0] == "exact" for s in st), st
    assert all(f == "CollectiveTimeout" for r, f in enumerate(first) if r != late), st


@pytest.mark.parametrize("error_set", [False, True])
def test_gather_reads_nothing_while_the_error_record_is_set(error_set):
    """dsl.staged_ok: with this rank's error record set (a wait of the stage-1 launch
    failed), the gather kernel writes no output; with it clear, every row."""
    import numpy as np

    from peerdsl import layout
    from peerdsl.runtime.errors import CollectiveError
    rows, hidden, world = 3, 2880, 2

    def body(comm):
        if error_set:
            comm._write_signal(layout.SIG_ERROR, np.array([1], np.int32))
        g = torch.Generator().manual_seed(3)
        residual = torch.randn(rows, hidden, generator=g).to(BF16)
        weight = (torch.rand(hidden, generator=g) + 0.5).to(BF16)
        staging = comm.peer_buffer((rows * hidden,), BF16)
        outs = norm_outputs(rows, hidden)
        try:  # the record is read (and raised) after the launch
            comm.launch("fused_ar_rms_gather", grid=2, constexprs={
                "T": "bf16", "H": hidden, "W": world, "FP8": "e4m3fn", "R": 4},
                staging=staging, residual=residual, weight=weight, sig=comm.signal,
                rank=comm.rank, rows=rows, eps=1e-6, flags=0, **outs)
        except CollectiveError:
            assert error_set
        return [bool(outs[k].view(torch.uint8).any()) for k in ("out", "residual_out")]

    written = peerdsl.sim.run(world, body, seed=2, target="sm_90")
    assert written == [[not error_set] * 2] * world


def test_sm90_dispatch_splits_where_the_sweep_measured_it_faster():
    """H <= 4096: the split schedule, at TP4 from 768 KiB (the two-stage threshold) and at TP2
    from 4 MiB; H = 6144 keeps the one-launch schedule at TP4 and the one-stage kernel at
    TP2; the runtime-H kernel splits up to MAXH 4096 and, at TP4, at MAXH 12288 and 16384;
    W = 8 never splits (not measured)."""
    def plan(world, rows, hidden):
        path = dispatch.plan_fused_ar_rms("sm_90", world, rows, hidden, torch.bfloat16)
        cx = dispatch.fused_2stage_kernel("sm_90", world, hidden) if path == "fused_2stage" else {}
        return path, cx.get("S")
    assert plan(4, 4096, 2880) == ("fused_2stage", 1)
    assert plan(4, 384, 2880) == ("fused_2stage", 1)
    assert plan(4, 256, 2880) == ("fused_2stage", 1)
    assert plan(4, 128, 2880) == ("fused_1stage", None)
    assert plan(4, 4096, 6144) == ("fused_2stage", 0)
    assert plan(2, 4096, 2880) == ("fused_2stage", 1)
    assert plan(2, 1024, 2880) == ("fused_2stage", 1)
    assert plan(2, 384, 2880) == ("fused_1stage", None)
    assert plan(2, 2048, 6144) == ("fused_1stage", None)
    assert plan(8, 4096, 2880) == ("fused_2stage", 0)
    assert dispatch.fused_2stage_kernel("sm_90", 4, 4096, runtime_h=True)["S"] == 1  # MAXH 4096
    # runtime-H: one launch at MAXH 6144 and 8192 (their predicated reads fit the
    # specialized schedules) and at W = 8; split again at TP4's MAXH 12288 and 16384, whose
    # one-launch form is the default schedule (call P3), but not at TP2
    for maxh, split in ((6144, 0), (8192, 0), (12288, 1), (16384, 1)):
        assert dispatch.fused_2stage_kernel("sm_90", 4, maxh, runtime_h=True)["S"] == split
    # stage 1 alone holds no row, so its U fits there
    assert dispatch.fused_2stage_kernel("sm_90", 4, 16384, runtime_h=True)["U"] == 4
    assert dispatch.fused_2stage_kernel("sm_90", 2, 16384, runtime_h=True)["S"] == 0
    assert plan(2, 1024, 16384) == ("fused_1stage", None)
    assert dispatch.fused_2stage_kernel("sm_90", 8, 8192, runtime_h=True)["S"] == 0
    assert dispatch.fused_2stage_kernel("sm_90", 8, 16384, runtime_h=True)["S"] == 0
    assert dispatch.plan_fused_ar_rms("gfx1250", 2, 4096, 2880, torch.bfloat16) == "fused_1stage"


def test_split_routing_edges(monkeypatch):
    """The TP2 route is for the split kernel only, from the fused two-stage hidden bound,
    and follows PEERDSL_FUSED_SPLIT; S = 0 on a target without schedules names nothing."""
    plan = lambda w, r, h: dispatch.plan_fused_ar_rms("sm_90", w, r, h, torch.bfloat16)  # noqa: E731
    assert plan(4, 4096, 1024) == "fused_1stage"  # under fused_two_stage_min_hidden
    assert plan(2, 8192, 1024) == "fused_1stage"
    monkeypatch.setenv("PEERDSL_FUSED_SPLIT", "0")
    assert plan(2, 4096, 2880) == "fused_1stage"
    assert dispatch.fused_2stage_kernel("gfx1250", 4, 6144) == {}
    monkeypatch.setenv("PEERDSL_FUSED_SPLIT", "1")
    assert plan(2, 2048, 6144) == "fused_2stage"


def test_kernel_variants_imports_first():
    """runtime/kernel_variants.py and runtime/dispatch.py import each other: either first."""
    import subprocess
    import sys
    for first in ("peerdsl.runtime.kernel_variants", "peerdsl.runtime.dispatch"):
        code = (f"import {first}; from peerdsl.runtime import dispatch; "
                "assert dispatch.fused_2stage_kernel('sm_90', 4, 2880)['S'] == 1")
        subprocess.run([sys.executable, "-c", code], check=True)


def test_communicator_takes_one_row_in_flight_for_few_rows():
    """The communicator's own launch plan (runtime/fused_launch.py) passes the call's rows,
    so an sm_90 TP4 build launches V = 1 up to 256 rows and V = 2 beyond, same kernel."""
    from peerdsl.runtime.built import from_registry
    from peerdsl.runtime.fused_launch import fused_kernel

    def body(comm):
        comm.built = from_registry("sm_90")
        comm.arch = "sm_90"
        return [fused_kernel(comm, "fused_2stage", rows, 6144, "bf16")[2]
                for rows in (64, 256, 257, 1024)]

    for plans in peerdsl.sim.run(4, body):
        assert [cx["V"] for cx in plans] == [1, 1, 2, 2]
        assert all(cx["U"] == 4 and cx["S"] == 0 for cx in plans)
