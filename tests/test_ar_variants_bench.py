"""The sweep and the one-rank (ncu) harness of issue 15 item 1, on the CPU: the sweep's
configs cover the build and the dispatch table, its report merges ranks and recommends the
crossover; the one-rank harness's pre-filled barrier slots let one rank's kernel run alone
(on the simulator), exact, with no error record."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import peerdsl.sim
from peerdsl import dsl, layout
from peerdsl.lowering.targets import get_target
from peerdsl.ops import allreduce_1stage as one, allreduce_2stage as two
from peerdsl.runtime import dispatch
from reference import all_reduce_ref
from test_ar_variants import BF16, _built, _inputs

# ----------------------------------------------------------------------------- the harnesses

def _bench_module(name: str):
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "benchmarks", f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _one_rank_args(comm, ncu, xs, rank: int, grid: int):
    """(rank's Signal buffer, launch arguments) of the one-rank harness on the simulator:
    every rank's input registered, the rank's Signal pre-filled as ncu_ar_one_rank.py does,
    the fake peers' Signals scratch."""
    W = len(xs)
    ins = [comm.to_device(x) for x in xs]
    table = comm.to_device(torch.tensor(layout.peer_row([b.addr for b in ins])))
    words = torch.zeros(layout.SIGNAL_BYTES // 4, dtype=torch.int32)
    words[layout.SIG_SPIN_LIMIT] = 3000
    ncu.prefill(words, rank, W, grid, torch)
    own = comm.to_device(words)
    scratch = [comm.alloc((layout.SIGNAL_BYTES // 4,), torch.int32) for _ in range(W)]
    return own, {"inp": table.addr, "rank": rank, "call": ncu.TAG,
                 "sig": [own.addr if p == rank else scratch[p].addr for p in range(W)]}


@pytest.mark.parametrize("path,U", [("1stage", 2), ("2stage", 1), ("2stage", 4)])
def test_one_rank_harness_prefill_lets_a_rank_run_alone(path, U):
    """benchmarks/ncu_ar_one_rank.py's premise, on the simulator: with the slots its two
    barriers wait on written in advance, one rank's kernel runs without its peers, three
    times in a row with its block epochs zeroed in between, exact, with no error record."""
    ncu = _bench_module("ncu_ar_one_rank")
    W, rank, grid, n = 4, 2, 3, 8 * 4 * 300
    xs = _inputs(W, n, 5)
    ref = all_reduce_ref(xs)

    def body(comm):
        own, args = _one_rank_args(comm, ncu, xs, rank, grid)
        out = comm.alloc((n,), BF16)
        shards = ref.view(W, -1)
        staging = [comm.to_device(shards[p].clone()) for p in range(W)]
        args["out"] = out
        cx = {"T": dsl.bf16, "W": W, "U": U, "B": 256}
        if path == "2stage":
            cx["E"] = 0
            args.update(staging=[s.addr for s in staging], shard_packs=n // 8 // W)
            kernel = two.allreduce_2stage
        else:
            args["n_packs"] = n // 8
            kernel = one.allreduce_1stage
        got = []
        for _ in range(3):
            comm.copy_in(own.addr + 4 * layout.SIG_EPOCH, torch.zeros(layout.MAX_BLOCKS,
                                                                       dtype=torch.int32))
            comm.launch_local(kernel, cx, grid, args)
            got.append(comm.to_torch(out, (n,), BF16).clone())
        err = comm.to_torch(own.addr + 4 * layout.SIG_ERROR, (layout.ERROR_WORDS,), torch.int32)
        return got, err

    (got, err), = peerdsl.sim.run(1, body, seed=3, target="sm_90",
                                  comm_cls=peerdsl.sim.SimCommunicator)
    assert err.tolist() == [0] * layout.ERROR_WORDS
    assert all(torch.equal(g, ref) for g in got)


def _norm_kernel_alone(comm, kernel, cx, grid, args, sig_addr, residual):
    """Launch one rank's norm-family kernel (sm_90 build constexprs plus `cx`) with `args`
    completed by the row arguments (weight 1): its residual_out and its Signal's error
    record."""
    rows, H = residual.shape
    res_out = comm.alloc((rows, H), BF16)
    args.update(residual=comm.to_device(residual), weight=comm.to_device(torch.ones(H, dtype=BF16)),
                out=comm.alloc((rows, H), BF16), residual_out=res_out, q=0, scale=0, rows=rows,
                eps=1e-6, flags=0)
    t = get_target("sm_90")
    comm.launch_local(kernel, {"T": dsl.bf16, "H": H, "FP8": t.fp8_format,
                               "R": t.row_reads_ahead, **cx}, grid, args)
    err = comm.to_torch(sig_addr + 4 * layout.SIG_ERROR, (layout.ERROR_WORDS,), torch.int32)
    return comm.to_torch(res_out, (rows, H), BF16), err


def test_one_rank_harness_prefill_lets_the_fused_one_stage_kernel_run_alone():
    """The same premise for `--path fused1`: fused_ar_rms_1stage has the same two barriers."""
    from peerdsl.ops.fused_ar_rms_1stage import fused_ar_rms_1stage
    ncu = _bench_module("ncu_ar_one_rank")
    W, rank, grid, rows, H = 4, 1, 3, 5, 2880
    xs = [x.view(rows, H) for x in _inputs(W, rows * H, 9)]
    residual = _inputs(1, rows * H, 10)[0].view(rows, H)
    want = (all_reduce_ref(xs).float() + residual.float()).to(BF16)

    def body(comm):
        own, args = _one_rank_args(comm, ncu, xs, rank, grid)
        return _norm_kernel_alone(comm, fused_ar_rms_1stage, {"W": W}, grid, args, own.addr,
                                  residual)

    (got, err), = peerdsl.sim.run(1, body, seed=3, target="sm_90",
                                  comm_cls=peerdsl.sim.SimCommunicator)
    assert err.tolist() == [0] * layout.ERROR_WORDS
    assert torch.equal(got, want)


def test_one_rank_harness_gather_staging_is_what_stage_one_leaves():
    """`--path gather`'s premise: with every rank's staging as `gather_staging` lays it out
    (rank p: column shard p of each all-reduced row), the split path's gather kernel alone
    gives the residual_out of the whole fused call, and its error record stays clear."""
    from peerdsl.ops.fused_ar_rms_gather import fused_ar_rms_gather
    from peerdsl.ops._row_slots import norm_min_blocks
    ncu = _bench_module("ncu_ar_one_rank")
    W, rank, rows, H = 4, 3, 5, 2880
    xs = [x.view(rows, H) for x in _inputs(W, rows * H, 11)]
    residual = _inputs(1, rows * H, 12)[0].view(rows, H)
    reduced = all_reduce_ref(xs).view(rows, H)
    want = (reduced.float() + residual.float()).to(BF16)

    def body(comm):
        staging = [comm.to_device(t) for t in ncu.gather_staging(reduced, W)]
        sig = comm.to_device(torch.zeros(layout.SIGNAL_BYTES // 4, dtype=torch.int32))
        args = {"staging": [t.addr for t in staging], "sig": [sig.addr] * W, "rank": rank}
        return _norm_kernel_alone(comm, fused_ar_rms_gather, {"W": W, "M": norm_min_blocks(H)},
                                  rows, args, sig.addr, residual)

    (got, err), = peerdsl.sim.run(1, body, seed=4, target="sm_90",
                                  comm_cls=peerdsl.sim.SimCommunicator)
    assert err.tolist() == [0] * layout.ERROR_WORDS
    assert torch.equal(got, want)


def test_sweep_configs_cover_the_build_and_the_table():
    V = _bench_module("bench_ar_variants")
    t = get_target("sm_90")
    built = [{"op": "allreduce_1stage", **{k: (str(v) if k == "T" else v) for k, v in c.items()}}
             for c in one.ar_variants(t)] + [
        {"op": "allreduce_2stage", **{k: (str(v) if k == "T" else v) for k, v in c.items()}}
        for c in two.variants(t)]
    built = [c for c in built if c["T"] == "bf16"]
    for world in (2, 4):
        cfgs = V.configs(built, world, dispatch.AR_KERNELS["sm_90"])
        names = [c["name"] for c in cfgs]
        assert names[:2] == ["default", "ll"] and len(names) == len(set(names))
        for U, B, E in _built(world, "2stage"):  # every (U, B) with E=0 is timed
            if E == 0:
                assert f"2stage U={U} B={B} E=0" in names
        for U, B, _ in _built(world, "1stage"):
            assert f"1stage U={U} B={B}" in names
        table = dispatch.AR_KERNELS["sm_90"]["2stage"][world]
        assert f"2stage U=auto B={table.block} E=0" in names
        assert "2stage U=1 B=256 E=1" in names  # the end barrier's cost, old shape
        assert len(V.configs(built, world, dispatch.AR_KERNELS["sm_90"], quick=True)) < len(cfgs)
        env = V.env_for(next(c for c in cfgs if c["name"] == "2stage U=2 B=512 E=0"), 1 << 22)
        assert env == {"PEERDSL_LL_MAX_BYTES": "0", "PEERDSL_AR_BLOCK": "512",
                       "PEERDSL_TWO_STAGE_MIN_WORLD": "2", "PEERDSL_TWO_STAGE_MIN_BYTES": "0",
                       "PEERDSL_AR_UNROLL": "2", "PEERDSL_AR_END_BARRIER": "0"}


def test_sweep_report_and_recommendation_from_merged_ranks():
    V = _bench_module("bench_ar_variants")
    names = ["default", "1stage U=1 B=256", "2stage U=4 B=256 E=0", "ll"]

    def rank(scale):
        rows = {}
        for r, (a, b) in {16: (10.0, 12.0), 1024: (60.0, 50.0), 4096: (200.0, 150.0)}.items():
            rows[str(r)] = {"default": {"status": "ok", "us": a * scale, "kernel": "1stage U=1"},
                            names[1]: {"status": "ok", "us": a * scale, "blocks_per_sm": 4},
                            names[2]: {"status": "ok", "us": b * scale, "blocks_per_sm": 2},
                            "ll": {"status": "n/a (path 1stage)"}}
        return {"configs": names, "rows": rows}
    merged = V.merge([rank(1.0), rank(1.1)])
    assert merged["rows"]["16"]["1stage U=1 B=256"]["us"] == pytest.approx(11.0)
    bad = rank(1.0)
    bad["rows"]["16"][names[2]] = {"status": "error: CollectiveTimeout: ..."}
    merged2 = V.merge([rank(1.0), bad])
    assert merged2["rows"]["16"][names[2]]["status"].startswith("error")
    summary = {"hidden": 6144, "tp4": merged}
    text = V.report(summary)
    assert "two-stage wins from 1024 rows (12582912 bytes)" in text
    assert "| 16 | 0.19 | 11.0 (1stage U=1) | 11.0 (1stage U=1 B=256) |" in text
    assert "| 2stage U=4 B=256 E=0 | 2 | 13.2 | 55.0 | 165.0 |" in text
