"""Prepared calls on the simulator (issue 15 item 3): `comm.prepare_fused_allreduce_rmsnorm`
and `comm.prepare_all_reduce`, for real on every path. Results exact against the reference
under skew at TP2/TP4, bitwise equal to the plain call of the same arguments, interleaved
with plain calls and with prepared calls of other sizes; ranks may mix staged prepared calls
with plain ones, and an in-place prepared call met by another call is a named mismatch; one
sequence number per call; preparing is agreed between the ranks; refused once broken or
closed. The GPU Communicator's half (CUDA fakes) is tests/test_prepared_call_gpu.py."""
from __future__ import annotations

import pytest
import torch

import peerdsl.sim
from peerdsl.runtime.errors import CollectiveError, CommunicatorBroken, CommunicatorClosed
from reference import add_rmsnorm_f64, all_reduce_ref, ulp_diff

H = 2880
BF16 = torch.bfloat16


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def inputs(step: int, rank: int, rows: int, hidden: int = H):
    g = torch.Generator().manual_seed(1000 * step + 17 * rows + rank)
    return (torch.randn(rows, hidden, generator=g).to(BF16),
            torch.randn(rows, hidden, generator=g).to(BF16),
            (torch.rand(hidden, generator=g) + 0.5).to(BF16))


def fused_ok(got, step: int, tp: int, rank: int, rows: int) -> bool:
    """residual_out bitwise and out within 1 ulp of the float64 reference (SPEC section 2)."""
    xs = [inputs(step, r, rows)[0] for r in range(tp)]
    _, residual, weight = inputs(step, rank, rows)
    ref_out, ref_res = add_rmsnorm_f64(all_reduce_ref(xs), residual, weight)
    out, res_out = got
    return same(res_out, ref_res) and out.shape == ref_out.shape and ulp_diff(out, ref_out) <= 1


def outcomes(*calls) -> list[str]:
    """What each call did in turn: "returned", "broken" (CommunicatorBroken), or the name of
    the collective error it raised."""
    seen = []
    for call in calls:
        try:
            call()
            seen.append("returned")
        except CommunicatorBroken:
            seen.append("broken")
        except CollectiveError as e:
            seen.append(type(e).__name__)
    return seen


def skew(i: int) -> list[int]:
    """A different start delay per rank and launch (scheduler steps)."""
    return [(i * 37 + r * 53) % 160 for r in range(8)]


# ---------------------------------------------------------------------------- simulator
@pytest.mark.parametrize("tp,path", [(2, "fused_1stage"), (2, "ll+rmsnorm"),
                                     (4, "fused_1stage"), (4, "fused_2stage"),
                                     (4, "ll+rmsnorm")])
def test_prepared_fused_is_exact_under_skew_and_equals_the_plain_call(monkeypatch, tp, path):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", path)
    rows = 5

    def body(comm):
        x, residual, weight = (t.clone() for t in inputs(0, comm.rank, rows))
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        report = [prep.path, prep.launches]
        for step in range(3):
            for t, new in zip((x, residual, weight), inputs(step, comm.rank, rows)):
                t.copy_(new)                      # the bound tensors, written in place
            seq = comm._seq
            got = prep()
            report.append(comm._seq - seq)        # one sequence number per call
            assert got is prep.result             # the same result tensors every call
            first = [t.clone() for t in got]
            plain = comm.fused_allreduce_rmsnorm(x, residual, weight)
            report.append(fused_ok(first, step, tp, comm.rank, rows))
            report.append(all(same(a, b) for a, b in zip(first, plain)))
        return report

    for rep in peerdsl.sim.run(tp, body, seed=3, skew=skew):
        launches = 2 if path == "ll+rmsnorm" else 1
        assert rep == [path, launches] + [1, True, True] * 3, rep


@pytest.mark.parametrize("path", ["fused_1stage", "ll+rmsnorm"])
@pytest.mark.parametrize("fp8_out", [False, True])
def test_prepared_call_at_a_runtime_hidden_size(monkeypatch, path, fp8_out):
    """H = 5120 has no specialized kernel: the prepared call launches the runtime-H variants
    the plain call picks (fused or add + RMSNorm, and the FP8 quant), with the same bytes."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", path)
    rows, hidden = 3, 5120

    def body(comm):
        x, residual, weight = inputs(1, comm.rank, rows, hidden)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, fp8_out=fp8_out)
        got = [None if t is None else t.clone() for t in prep()]
        plain = comm.fused_allreduce_rmsnorm(x, residual, weight, fp8_out=fp8_out)
        return prep.path, [a is None and b is None or same(a, b) for a, b in zip(got, plain)]

    for rep in peerdsl.sim.run(2, body, seed=5, skew=skew):
        assert rep[0] == path and all(rep[1]), rep


def test_prepared_calls_of_several_sizes_interleave_with_plain_calls(monkeypatch):
    """Prepared objects of different sizes, paths and options (fp8, gemma, staged input, an
    all-reduce) called in an irregular order with plain calls of other sizes in between."""
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", "16384")  # 1 row LL, 3 and 6 rows one-stage
    tp = 4
    order = [0, 1, 2, 3, 1, 0, 3, 2, 2, 1]

    def body(comm):
        preps, bound = [], []
        for rows, kw in ((1, {}), (6, {"gemma_norm": True}), (3, {"stage_input": True})):
            x, residual, weight = (t.clone() for t in inputs(0, comm.rank, rows))
            preps.append(comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **kw))
            bound.append((x, residual, weight, rows, kw))
        a = torch.zeros(12288, dtype=BF16)        # 24 KiB: two-stage at TP4 with that cap
        out = torch.full_like(a, 7)
        ar = comm.prepare_all_reduce(a, out=out)
        report = [p.path for p in preps] + [ar.path, ar.result is out]
        for step, i in enumerate(order):
            if i == 3:
                a.copy_(torch.randn(12288, generator=torch.Generator().manual_seed(
                    step * 10 + comm.rank)).to(BF16))
                got = ar().clone()
                xs = comm.exchange(a.clone())
                report.append(same(got, all_reduce_ref(xs)))
            else:
                x, residual, weight, rows, kw = bound[i]
                for t, new in zip((x, residual, weight), inputs(step, comm.rank, rows)):
                    t.copy_(new)
                got = [t.clone() for t in preps[i]()]
                gemma = kw.get("gemma_norm", False)
                xs = comm.exchange(x.clone())
                ref_out, ref_res = add_rmsnorm_f64(all_reduce_ref(xs), residual, weight,
                                                   gemma_norm=gemma)
                report.append(same(got[1], ref_res) and ulp_diff(got[0], ref_out) <= 1)
            # a plain call of another size between prepared ones
            px, pres, pw = inputs(100 + step, comm.rank, 2)
            plain = comm.fused_allreduce_rmsnorm(px, pres, pw)
            pref = add_rmsnorm_f64(all_reduce_ref(comm.exchange(px)), pres, pw)
            report.append(same(plain[1], pref[1]))
        return report

    for rep in peerdsl.sim.run(tp, body, seed=5, skew=skew):
        assert rep[:5] == ["ll+rmsnorm", "fused_1stage", "fused_1stage", "2stage", True], rep
        assert rep[5:] == [True] * 2 * len(order), rep


def test_prepared_fp8_outputs_equal_the_plain_call(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 4)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, fp8_out=True,
                                                    bf16_mirror=True)
        got = [t.clone() for t in prep()]
        plain = comm.fused_allreduce_rmsnorm(x, residual, weight, fp8_out=True,
                                             bf16_mirror=True)
        return prep.result._fields, [same(a, b) for a, b in zip(got, plain)]

    for fields, equal in peerdsl.sim.run(2, body, seed=2):
        assert fields == ("q", "residual_out", "scale", "mirror") and equal == [True] * 4


@pytest.mark.parametrize("tp,env,path", [(2, {}, "ll"),
                                         (2, {"PEERDSL_LL_MAX_BYTES": "0"}, "1stage"),
                                         (4, {"PEERDSL_LL_MAX_BYTES": "0"}, "2stage")])
@pytest.mark.parametrize("stage_input", [False, True])
def test_prepared_all_reduce_paths(monkeypatch, tp, env, path, stage_input):
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def body(comm):
        x = torch.zeros(4, 512, dtype=BF16)
        prep = comm.prepare_all_reduce(x, stage_input=stage_input)
        ok = []
        for step in range(2):
            x.copy_(inputs(step, comm.rank, 4, 512)[0])
            got = prep().clone()
            ok.append(same(got, all_reduce_ref(comm.exchange(x.clone()))))
            ok.append(same(got, comm.all_reduce(x)))
        return prep.path, ok

    for got_path, ok in peerdsl.sim.run(tp, body, seed=7, skew=skew):
        assert got_path == path and ok == [True] * 4


def test_ranks_may_mix_staged_prepared_and_plain_calls(monkeypatch):
    """A prepared call that stages its input (as plain calls do) is the plain call of the
    same arguments: the same sequence numbers, tags and kernels, so one rank may make it
    prepared while its peers make it plain."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
    rows = 3

    def body(comm):
        x, residual, weight = (t.clone() for t in inputs(0, comm.rank, rows))
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, eps=1e-6,
                                                    stage_input=True)
        ok = []
        for step in range(4):
            for t, new in zip((x, residual, weight), inputs(step, comm.rank, rows)):
                t.copy_(new)
            if (comm.rank + step) % 2:
                got = [t.clone() for t in prep()]
            else:
                got = comm.fused_allreduce_rmsnorm(x, residual, weight, eps=1e-6)
            ok.append(fused_ok(got, step, 2, comm.rank, rows))
        seq, tag, key = comm._call_log.recent[-1]
        return ok, key

    (ok0, key0), (ok1, key1) = peerdsl.sim.run(2, body, seed=4, skew=skew)
    assert ok0 == ok1 == [True] * 4 and key0 == key1


@pytest.mark.parametrize("other", ["the plain call", "another prepared call"])
def test_an_in_place_prepared_call_met_by_another_call_is_a_mismatch(monkeypatch, other):
    """Read in place, the input peers read is the prepared call's bound tensor: a peer
    making the plain call (it reads the pool) or another prepared call at that point must
    not pass for it. Its tag names the prepared call, so the ranks raise collective errors
    (a mismatch, or the abort mark of the peer that saw one) instead of returning a result
    computed from the wrong memory."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        a = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        b = comm.prepare_fused_allreduce_rmsnorm(x.clone(), residual, weight)
        a(), b()                                  # the same order on every rank: fine
        comm.fused_allreduce_rmsnorm(x, residual, weight)  # (grows the simulator's pool)
        if comm.rank == 0:
            first = (lambda: comm.fused_allreduce_rmsnorm(x, residual, weight)) \
                if other == "the plain call" else b
        else:
            first = a
        return outcomes(first, a), str(comm.broken)

    results = peerdsl.sim.run(2, body, seed=1, spin_limit=3000)
    for seen, _ in results:
        assert seen[0] in ("CollectiveMismatch", "CollectiveAborted") and seen[1] == "broken"
    mismatch = [first for seen, first in results if seen[0] == "CollectiveMismatch"]
    assert mismatch and any("fused_allreduce_rmsnorm[prepared #" in m for m in mismatch)


def test_preparing_is_collective_and_agreed(monkeypatch):
    """A rank whose inputs fail the checks raises its own error and its peers a named
    RuntimeError (nobody waits for it); ranks preparing different calls all raise."""
    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        got = []
        bad = residual[:1] if comm.rank == 1 else residual
        try:
            comm.prepare_fused_allreduce_rmsnorm(x, bad, weight)
        except (ValueError, RuntimeError) as e:
            got.append((type(e).__name__, str(e)[:120]))
        try:
            comm.prepare_all_reduce(x if comm.rank == 0 else x[:1])
        except ValueError as e:
            got.append((type(e).__name__, str(e)[:200]))
        prep = comm.prepare_all_reduce(x)          # agreed: prepared everywhere
        got.append(same(prep(), all_reduce_ref(comm.exchange(x))))
        return got

    r0, r1 = peerdsl.sim.run(2, body, seed=1)
    assert r0[0][0] == "RuntimeError" and "rank 1: ValueError: residual has shape" in r0[0][1]
    assert r1[0][0] == "ValueError" and r1[0][1].startswith("residual has shape")
    for r in (r0, r1):
        assert r[1][0] == "ValueError" and "ranks prepared different calls" in r[1][1]
        assert "all_reduce(bf16[2, 2880])" in r[1][1] and "all_reduce(bf16[1, 2880])" in r[1][1]
        assert r[2] is True


def test_paths_without_a_prepared_form_make_the_plain_call(monkeypatch):
    """A non-contiguous input (the unfused path) and the torch.distributed fallback: each
    call is the plain call (its own sequence number), its result copied into the bound
    outputs."""
    monkeypatch.setenv("PEERDSL_CUSTOM_AR_MAX_BYTES", "64")   # every all-reduce: fallback

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 3)
        strided = x.t().contiguous().t()                       # the same values, transposed
        prep = comm.prepare_fused_allreduce_rmsnorm(strided, residual, weight)
        ar = comm.prepare_all_reduce(x)
        seq = comm._seq
        got = [t.clone() for t in prep()]
        reduced = ar().clone()
        return (prep.path, prep.fast, ar.path, ar.fast, comm._seq - seq,
                fused_ok(got, 0, 2, comm.rank, 3),
                same(reduced, all_reduce_ref([inputs(0, r, 3)[0] for r in range(2)])))

    for rep in peerdsl.sim.run(2, body, seed=1):
        assert rep == ("unfused", False, "fallback", False, 2, True, True), rep


def test_prepared_call_is_refused_once_broken(monkeypatch):
    """Rank 1's call fails its input check (its sequence number is used), so its next
    prepared call carries another call's tag: every rank raises a collective error, and
    every later call, prepared or plain, raises CommunicatorBroken. A rank names the
    mismatch, or the peer's abort where its poll came after that peer's block had seen the
    mismatch and sent its next arrival (one slot per block and peer; which one is the
    schedule's choice, seed 2 of the simulator gives both); at least one rank names it."""
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")

    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        prep()
        if comm.rank == 1:
            with pytest.raises(ValueError):
                comm.fused_allreduce_rmsnorm(x, residual[:1], weight)
        seen = outcomes(prep, prep, lambda: comm.fused_allreduce_rmsnorm(x, residual, weight))
        return seen, comm.broken is not None

    for seed in (1, 2):
        reports = peerdsl.sim.run(2, body, seed=seed, spin_limit=3000,
                                  rendezvous_timeout_s=20.0)
        for seen, broken in reports:
            assert broken and seen[1:] == ["broken", "broken"], seen
            assert seen[0] in ("CollectiveMismatch", "CollectiveAborted"), seen
        assert "CollectiveMismatch" in [seen[0] for seen, _ in reports], reports


def test_prepared_call_after_close_raises_and_launches_nothing():
    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        prep = comm.prepare_fused_allreduce_rmsnorm(x, residual, weight)
        ar = comm.prepare_all_reduce(x)
        prep()
        launches = comm.job.launches
        comm.barrier()
        comm.close()
        raised = []
        for call in (prep, ar, lambda: comm.prepare_all_reduce(x)):
            with pytest.raises(CommunicatorClosed):
                call()
            raised.append(True)
        return raised, comm.job.launches == launches

    assert peerdsl.sim.run(2, body) == [([True] * 3, True)] * 2


def test_prepare_checks_like_the_plain_call():
    def body(comm):
        x, residual, weight = inputs(0, comm.rank, 2)
        errors = []
        for kw, exc in (({"out": residual}, ValueError),            # overlaps an input
                        ({"out": torch.empty(3, H, dtype=BF16)}, ValueError),
                        ({"bogus": 1}, TypeError),
                        ({"fp8_out": True, "out": torch.empty(2, H, dtype=BF16)}, ValueError)):
            with pytest.raises(exc) as e:
                comm.prepare_fused_allreduce_rmsnorm(x, residual, weight, **kw)
            errors.append(str(e.value))
        with pytest.raises(ValueError, match="residual has shape"):
            comm.prepare_fused_allreduce_rmsnorm(x, residual[:1], weight)
        empty = comm.prepare_fused_allreduce_rmsnorm(x[:0], residual[:0], weight)
        seq = comm._seq
        got = empty()
        return errors, empty.path, comm._seq - seq, tuple(got[0].shape), comm.job.launches

    for errors, path, used, shape, launches in peerdsl.sim.run(2, body):
        assert path == "empty" and used == 1 and shape == (0, H) and launches == 0
        assert "out overlaps residual" in errors[0] and "bogus" in errors[2]
