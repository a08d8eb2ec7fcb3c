"""SPEC section 7's interleave test on the simulator, and its proof of power.

Alternating fused calls (an LL-path size and a two-stage size), a tiny all-reduce (one
block), a large all-reduce (two-stage, several blocks) and an all-gather on one communicator,
every rank started a different number of scheduler steps late at every launch, every result
checked against the fp32 reference, and the grid of every collective launch chosen afresh
(grid changes between launches are what the LL block-epoch race needs). With the Signal mix-up (a fused kernel keeping its own
epoch counters) or the LL epoch race (per-block LL epochs) put back, it fails.
"""
from __future__ import annotations

import random

import pytest
import torch

import peerdsl.sim
from peerdsl import dsl, layout
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from peerdsl.ops import allreduce_ll as ll_mod
from peerdsl.ops import registry
from peerdsl.ops._rows import NORM_BLOCK
from peerdsl.ops.fused_ar_rms_2stage import two_stage
from peerdsl.runtime.errors import CollectiveError, SimError
from peerdsl.runtime.sim.collective_comm import SimCollectiveComm
from reference import add_rmsnorm_f64, all_reduce_ref, ulp_diff

TP, H = 4, 6144
FUSED_ROWS = (1, 3)          # LL path (12 KB) and two-stage (36 KB) under a 32 KiB LL cap
TINY, LARGE = 2048, 16 * H   # elements: one LL block; a two-stage all-reduce over 4 blocks
BF16 = torch.bfloat16

# words of the Signal page no protocol uses: where the broken kernels keep their own counters
PRIVATE = layout.SIGNAL_WORDS


def run_interleave(steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    plan = []
    for step in range(steps):
        rows = FUSED_ROWS[step % 2]
        xs = [torch.randn(rows, H, generator=g).to(BF16) for _ in range(TP)]
        plan.append(dict(
            xs=xs, residual=torch.randn(rows, H, generator=g).to(BF16),
            weight=(torch.rand(H, generator=g) + 0.5).to(BF16),
            tiny=[torch.randn(TINY, generator=g).to(BF16) for _ in range(TP)],
            large=[torch.randn(LARGE, generator=g).to(BF16) for _ in range(TP)],
            gather=[torch.randn(TINY, generator=g).to(BF16) for _ in range(TP)]))
    rng = random.Random(seed)
    delays = [[rng.randrange(0, 400) for _ in range(TP)] for _ in range(steps * 8)]

    def body(comm):
        r = comm.rank
        for step, p in enumerate(plan):
            out, res_out = comm.fused_allreduce_rmsnorm(p["xs"][r], p["residual"], p["weight"])
            ar = all_reduce_ref(p["xs"])
            ref_out, _ = add_rmsnorm_f64(ar, p["residual"], p["weight"])
            where = f"step {step} rank {r} ({comm.last_path})"
            assert torch.equal(res_out, (ar.float() + p["residual"].float()).to(BF16)), where
            assert ulp_diff(out, ref_out) <= 1, where
            assert torch.equal(comm.all_reduce(p["tiny"][r]), all_reduce_ref(p["tiny"])), where
            assert torch.equal(comm.all_reduce(p["large"][r]), all_reduce_ref(p["large"])), where
            assert torch.equal(comm.all_gather(p["gather"][r]), torch.stack(p["gather"])), where
        return True

    class VaryingGridComm(SimCollectiveComm):
        """Every collective launch picks its grid afresh (the same on every rank: each rank
        makes the same calls in the same order), so grid sizes change between launches."""

        def _grid(self, work_items: int, per_block: int = 256) -> int:
            self.calls = getattr(self, "calls", 0) + 1
            most = max(1, min(self.max_grid, (work_items + per_block - 1) // per_block))
            return random.Random(seed * 7919 + self.calls).randint(1, most)

    assert all(peerdsl.sim.run(TP, body, seed=seed, skew=lambda i: delays[i % len(delays)],
                               comm_cls=VaryingGridComm))


@pytest.fixture
def ll_cap(monkeypatch):
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", str(32 << 10))
    monkeypatch.delenv("PEERDSL_FUSED_PATH", raising=False)


def test_interleave(ll_cap, long_run):
    steps, seeds = (300, 20) if long_run else (4, 2)
    for seed in range(seeds):
        run_interleave(steps, seed)


# ----------------------------------------------------------------------------- broken variants

class OwnCounterSignal(dsl.Signal):
    """The seed bug: the Signal's slots, but this kernel's own epoch counters."""

    def __init__(self, sig, rank, world):
        super().__init__(sig, rank, world)
        self._epoch_ptr = self.self_sig + (PRIVATE + self.block)
        self._base = dsl.load(self._epoch_ptr)


@dsl.kernel(block_size="B")
def fused_2stage_own_counters(inp: RegisteredPtrs["T"], staging: PeerPtrs["T"], residual: Ptr["T"],
                              weight: Ptr["T"], out: Ptr["T"], residual_out: Ptr["T"],
                              q: Ptr[dsl.i8], scale: Ptr[dsl.f32], sig: PeerPtrs[dsl.i32],
                              rank: dsl.i32, rows: dsl.i32, eps: dsl.f32, flags: dsl.i32,
                              T: constexpr, H: constexpr, W: constexpr, FP8: constexpr,
                              B: constexpr = NORM_BLOCK):
    two_stage(OwnCounterSignal(sig, rank, W), inp, staging, residual, weight, out,
              residual_out, q, scale, rank, rows, eps, flags, T, H, W, FP8)


@dsl.kernel(block_size=256)
def allreduce_ll_block_epoch(x: Ptr["T"], out: Ptr["T"], sig: PeerPtrs[dsl.i32],
                             ll: PeerPtrs[dsl.i32], rank: dsl.i32, n_packs: dsl.i32,
                             lines_per_peer: dsl.i32, T: constexpr, W: constexpr):
    """The LL block-epoch race: each block keeps its own LL epoch."""
    me = sig[rank]
    mine_epoch = me + (PRIVATE + dsl.block_id())
    epoch = dsl.load(mine_epoch) + 1
    bank_base = (epoch & 1) * (W * lines_per_peer)
    ll_mod.ll_push(x, ll, rank, epoch, bank_base, n_packs, lines_per_peer, W)
    ll_mod.ll_collect(out, ll, me, rank, epoch, bank_base, n_packs, lines_per_peer, T, W)
    dsl.barrier()
    if dsl.thread_id() == 0:
        dsl.store(mine_epoch, epoch)


def _fails_within(seeds: int) -> int:
    for seed in range(seeds):
        try:
            run_interleave(4, seed)
        except (AssertionError, CollectiveError, SimError):
            return seed
    pytest.fail(f"the broken variant passed {seeds} seeds")


@pytest.mark.parametrize("op,broken", [
    ("fused_ar_rms_2stage", fused_2stage_own_counters),
    ("allreduce_ll", allreduce_ll_block_epoch),
])
def test_interleave_catches_broken_variant(ll_cap, monkeypatch, op, broken):
    spec = registry.load_all()[op]
    monkeypatch.setitem(registry.REGISTRY, op, registry.OpSpec(op, broken, spec.variants))
    _fails_within(10)
