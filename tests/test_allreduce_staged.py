"""The staged one-stage all-reduce (ops/allreduce_staged.py): one barrier, no end barrier.

Every built variant stores the rank-order reference bytes on every rank, back to back and
interleaved with the LL kernels (which share its launch epoch) and the barrier kernels, under
skew, with a different grid each launch; a constant half (no parity) is caught; the fault rules
hold; dispatch sends it only what its half holds, and only where a target's table (or the
environment) asks for it; a prepared call takes the same path with the plain call's tag.
"""
from __future__ import annotations

import random

import pytest
import torch

import peerdsl.sim
from peerdsl import dsl, layout
from peerdsl.dsl import PeerPtrs, Ptr, constexpr
from peerdsl.lowering.targets import get_target
from peerdsl.ops import allreduce_staged as staged
from peerdsl.runtime import dispatch
from peerdsl.runtime.sim.collective_comm import SimCollectiveComm
from reference import all_reduce_ref

from faults.fault_harness import Step, first_errors, run_case, statuses

BF16 = torch.bfloat16
ENV = ("PEERDSL_AR_BLOCK", "PEERDSL_AR_UNROLL", "PEERDSL_TWO_STAGE_MIN_BYTES",
       "PEERDSL_TWO_STAGE_MIN_WORLD", "PEERDSL_LL_MAX_BYTES", "PEERDSL_STAGED_MAX_BYTES")
LL_CAP = 4 << 10          # below it the LL kernel, up to STAGED_CAP the staged one
STAGED_CAP = 64 << 10


@pytest.fixture
def staged_env(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", str(LL_CAP))
    monkeypatch.setenv("PEERDSL_STAGED_MAX_BYTES", str(STAGED_CAP))
    monkeypatch.setenv("PEERDSL_TWO_STAGE_MIN_BYTES", "0")
    return monkeypatch


class RandomGridComm(SimCollectiveComm):
    """Each collective launch gets a grid drawn afresh between 1 and what the runtime asked
    for (the same draw on every rank), and a delay drawn per rank and launch."""
    seed = 0
    max_grid = 3
    paths: list = []

    def _grid(self, work_items: int, per_block: int = 256) -> int:
        most = super()._grid(work_items, per_block)
        self.calls = getattr(self, "calls", 0) + 1
        return random.Random(7919 * self.calls + self.seed).randint(1, most)

    def _launch(self, name, constexprs, grid, args, local=False):
        self.delay = random.Random(self.seed * 1009 + self.calls * 31 + self.rank).randint(0, 900)
        if self.rank == 0:
            type(self).paths.append(name)
        return super()._launch(name, constexprs, grid, args, local)


def _inputs(world: int, n: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [((torch.randn(n, generator=g) * (1 + r))).to(BF16) for r in range(world)]


def _run(world: int, sizes: list[int], seed: int, target: str = "sm_90") -> list[str]:
    """all_reduce of each size in turn on every rank; every result checked. Returns the
    kernels launched (rank 0)."""
    every = [_inputs(world, n, seed * 100 + i) for i, n in enumerate(sizes)]

    def body(comm):
        return [comm.all_reduce(every[i][comm.rank]) for i in range(len(sizes))]

    RandomGridComm.seed, RandomGridComm.paths = seed, []
    res = peerdsl.sim.run(world, body, seed=seed, target=target, comm_cls=RandomGridComm,
                          skew=lambda i: [((i + 1) * 37 * r) % 101 for r in range(world)])
    for i, n in enumerate(sizes):
        ref = all_reduce_ref(every[i])
        for r in range(world):
            assert torch.equal(res[r][i].view(torch.int16), ref.view(torch.int16)), \
                f"call {i} ({n} elements, {RandomGridComm.paths[i]}), rank {r}"
    return RandomGridComm.paths


# sizes (elements, bf16): staged ones back to back with different grids, an odd pack count,
# then LL (shares the launch epoch) and one-/two-stage calls between staged ones
STAGED_SIZES = [8 * 1031, 2880, 16 * 1024, 8 * 259]
MIXED = [2880, 1024, 8 * 1031, 1024, 1024, 2880, 40 * 1024, 8 * 1031, 40 * 1024, 2880]


def _built(world: int) -> list[tuple[int, int]]:
    vs = staged.ar_variants(get_target("sm_90"))
    return sorted({(v["U"], v["B"]) for v in vs if v["W"] == world and v["T"] == dsl.bf16})


@pytest.mark.parametrize("world,U,B", [(w, *v) for w in (2, 4, 8) for v in _built(w)
                                       if v[1] != 512 or v[0] == 2])
def test_every_sm90_variant_is_exact_back_to_back(staged_env, world, U, B):
    staged_env.setenv("PEERDSL_AR_UNROLL", str(U))
    staged_env.setenv("PEERDSL_AR_BLOCK", str(B))
    paths = _run(world, STAGED_SIZES * 2, seed=U * 7 + B + world)
    assert paths == ["allreduce_staged"] * 8


@pytest.mark.parametrize("world,target", [(2, "sm_90"), (4, "sm_90"), (4, "gfx1250"),
                                          (8, "gfx1250")])
def test_exact_between_the_ll_and_barrier_kernels(staged_env, world, target):
    staged_env.setenv("PEERDSL_STAGED_MAX_BYTES", str(32 << 10))  # 40K elements: 1-/2-stage
    paths = _run(world, MIXED, seed=world, target=target)
    assert {"allreduce_staged", "allreduce_ll"} <= set(paths), paths
    assert set(paths) - {"allreduce_staged", "allreduce_ll"}, paths


# ----------------------------------------------------------------------------- the parity

@dsl.kernel(block_size="B")
def two_staged_calls(x_a: Ptr["T"], x_b: Ptr["T"], halves: PeerPtrs["T"], out_a: Ptr["T"],
                     out_b: Ptr["T"], sig: PeerPtrs[dsl.i32], rank: dsl.i32, n_packs: dsl.i32,
                     half_packs: dsl.i32, T: constexpr, W: constexpr, U: constexpr,
                     B: constexpr, FIXED: constexpr):
    """Two staged all-reduces back to back in one launch, in halves 0 and 1 (FIXED = 1: both
    in half 0). Block b of a rank starts the second as soon as it finished the first (weaker
    than stream order), so a fast rank writes its next half while slow peers still read."""
    staged.stage_and_sum(dsl.Signal(sig, rank, W, call=21), x_a, halves, out_a, rank,
                         n_packs, 0, T, W, U)
    dsl.barrier()  # thread 0 advanced the epoch: every thread reads it for the next Signal
    staged.stage_and_sum(dsl.Signal(sig, rank, W, call=22), x_b, halves, out_b, rank,
                         n_packs, 0 if FIXED else half_packs, T, W, U)


def _two_calls(world: int, fixed: int, seed: int) -> bool:
    """True when both calls gave the reference bytes on every rank."""
    n = 8 * 256 * 3 * world
    a, b = _inputs(world, n, seed), _inputs(world, n, seed + 50)

    def body(comm):
        outs = [comm.alloc((n,), BF16), comm.alloc((n,), BF16)]
        args = dict(x_a=comm.to_device(a[comm.rank]), x_b=comm.to_device(b[comm.rank]),
                    halves=comm.halves_peers, out_a=outs[0], out_b=outs[1],
                    sig=comm.signal_peers, rank=comm.rank, n_packs=n // 8,
                    half_packs=comm.half_packs)
        comm.delay = random.Random(seed * 100 + comm.rank).randint(0, 3000)
        comm.launch_ir(two_staged_calls,
                       {"T": dsl.bf16, "W": world, "U": 1, "B": 256, "FIXED": fixed}, 3, args)
        return [comm.to_torch(o, (n,), BF16) for o in outs]

    res = peerdsl.sim.run(world, body, seed=seed, target="sm_90",
                          skew=lambda i: [(i * 53 * r) % 211 for r in range(world)])
    refs = all_reduce_ref(a), all_reduce_ref(b)
    return all(torch.equal(g, ref) for got in res for g, ref in zip(got, refs))


@pytest.mark.parametrize("world,seed", [(2, 1), (4, 2), (8, 3)])
def test_two_calls_in_alternate_halves_stay_exact(world, seed):
    assert _two_calls(world, 0, seed)


def test_one_half_for_both_calls_is_caught():
    """What the parity protects: with one half, some seed gives a wrong result."""
    for seed in range(10):
        if not _two_calls(4, 1, seed):
            return
    pytest.fail("two staged calls in one half stayed exact for 10 seeds")


# ----------------------------------------------------------------------------- faults

def test_a_late_rank_times_out_its_peers_and_is_refused_after(staged_env):
    """The peers time out at the one barrier; the late rank finds their arrivals (sent before
    their waits expired, after their halves were staged), so its call is exact: the one
    barrier has no later arrival to carry the abort mark. Every later call raises."""
    late = 3

    def before(comm, i):
        comm.delay = 400_000 if (comm.rank, i) == (late, 1) else 0
    res = run_case(f"sm_90 staged all_reduce, rank {late} late", 4, [Step("ar", 8192)] * 4,
                   before=before, target="sm_90")
    st, first = statuses(res), first_errors(res)
    assert all(s[0] == "exact" for s in st), st
    assert all(f == "CollectiveTimeout" for r, f in enumerate(first) if r != late), st
    assert st[late][1] == "exact", st
    assert all(s[2] != "exact" and s[3] != "exact" for s in st), st


def test_sizes_that_disagree_are_named_not_corrupt(staged_env):
    res = run_case("sm_90 staged all_reduce, rank 1 smaller", 2, [Step("ar", 8192)] * 3,
                   overrides={(1, 1): Step("ar", 4096)}, target="sm_90")
    st = statuses(res)
    assert all(s[0] == "exact" for s in st), st
    assert all(s[1] not in ("exact", "wrong") for s in st), st


# ----------------------------------------------------------------------------- dispatch

def test_dispatch_takes_the_staged_path_only_where_asked(monkeypatch):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    assert dispatch.TABLES["gfx1250"].staged_max_bytes == 0  # the PR's thresholds
    plan = dispatch.plan_all_reduce
    big = 6 << 20  # past gfx1250's LL range (4 MiB)
    assert plan("gfx1250", 2, big) == "1stage"
    monkeypatch.setenv("PEERDSL_STAGED_MAX_BYTES", str(big))
    assert plan("gfx1250", 2, big) == "staged"
    assert plan("gfx1250", 2, big + 16) == "1stage"
    assert plan("gfx1250", 2, 4 << 20) == "ll"  # the LL range comes first
    # a communicator's half caps it, whatever the setting
    cap = {"staged_max_bytes": 5 << 20}
    assert plan("gfx1250", 2, 5 << 20, capacity=cap) == "staged"
    assert plan("gfx1250", 2, (5 << 20) + 16, capacity=cap) == "1stage"


def test_the_halves_follow_the_staging_in_the_meta_buffer():
    m = layout.MetaLayout(4)
    assert m.halves_offset == m.staging_offset + m.staging_bytes
    assert m.total_bytes == m.halves_offset + 2 * layout.STAGED_HALF_BYTES


# ----------------------------------------------------------------------------- prepared

def test_prepared_call_takes_the_staged_path_with_the_plain_calls_tag(staged_env):
    world, n = 2, 8 * 1031
    xs = _inputs(world, n, 5)

    def body(comm):
        x = xs[comm.rank].clone()
        prep = comm.prepare_all_reduce(x)
        got = []
        for i in range(3):  # rank 1 mixes plain calls in where rank 0 calls the prepared one
            got.append(prep().clone() if (comm.rank + i) % 2 else comm.all_reduce(x))
        return prep.path, got

    res = peerdsl.sim.run(world, body, seed=3, target="sm_90")
    ref = all_reduce_ref(xs)
    for path, got in res:
        assert path == "staged"
        assert all(torch.equal(g, ref) for g in got)
