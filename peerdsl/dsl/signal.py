"""The Signal: the only way a kernel synchronizes with its peers (SPEC section 3).

Per-block epochs live in device memory (the Signal's epoch words), so graph replay and
kernels of different kinds sharing the Signal all advance the same counters. A barrier
compares slots with `>=` against the new epoch. Every spin is bounded by the host-set
spin limit; on expiry the first failing block writes an error record the host reads.
"""
from __future__ import annotations

from typing import Any

from .. import layout
from .builder import TraceError, state, user_location
from .intrinsics import block_id, select, thread_id
from .kernel import PeerTable
from .memory import atomic_cas, barrier, load, store
from .values import Pointer, Scalar, as_scalar, declare_own_rank


def record_error(sig: Pointer, rank: Any, what: int, expected: Any, seen: Any) -> None:
    """Write (rank, block, what, expected, seen) unless another spin already did."""
    err = sig + layout.SIG_ERROR
    if atomic_cas(err, 0, 1, "system", "acq_rel") == 0:
        store(err + 1, rank, "system", "relaxed")
        store(err + 2, block_id(), "system", "relaxed")
        store(err + 3, what, "system", "relaxed")
        store(err + 4, expected, "system", "relaxed")
        store(err + 5, seen, "system", "relaxed")


def spin_limit(sig: Pointer) -> Scalar:
    """The host's spin limit, or 0 once any spin of this rank has expired: after the first
    timeout every later wait gives up at once, so a dead peer costs one timeout, not one per
    wait."""
    expired = load(sig + layout.SIG_ERROR, "system", "relaxed")
    return select(expired != 0, 0, load(sig + layout.SIG_SPIN_LIMIT))


def spin_until_ge(flag: Pointer, target: Any, sig: Pointer, rank: Any, what: int) -> Scalar:
    """Acquire-load `flag` until it is >= target, at most the host's spin limit times.

    Returns 1 when the wait succeeded, 0 when it expired (an error record is then written).
    """
    limit = spin_limit(sig)
    seen = load(flag, "system", "acquire")
    n = 0
    while (seen < target) and (n < limit):
        seen = load(flag, "system", "acquire")
        n = n + 1
    ok = seen >= target
    if not ok:
        record_error(sig, rank, what, target, seen)
    return ok.to_i32()


class Signal:
    """Barriers between the blocks of the same index on every rank.

    `sig` is the peer table of every rank's Signal base (i32 words); `rank` this rank,
    `world` a constexpr. Each barrier of a launch uses the next epoch of this block's
    device-side counter (one slot array, monotonic values compared with >=), so kernels of
    any kind sharing the Signal can never release each other's barriers early.
    """

    def __init__(self, sig: PeerTable, rank: Any, world: int):
        if not isinstance(world, int) or not 1 <= world <= layout.MAX_RANKS:
            raise ValueError(f"world size {world!r} must be a constant in [1, {layout.MAX_RANKS}]")
        self.peers = sig
        self.rank = as_scalar(rank)
        declare_own_rank(self.rank)  # sig[rank] and friends are this rank's own memory
        self.world = world
        self.self_sig = sig[self.rank]
        self.block = block_id()
        self._epoch_ptr = self.self_sig + (layout.SIG_EPOCH + self.block)
        self._base = load(self._epoch_ptr)
        self._used = 0
        self.finished = False
        st = state()
        self._depth = len(st.blocks)
        st.signals.append(self)

    def _slot(self, owner: Pointer, peer: Any) -> Pointer:
        return owner + (layout.SIG_SLOTS + self.block * layout.MAX_RANKS + peer)

    def _barrier(self, what: int) -> None:
        if len(state().blocks) != self._depth or self.finished:
            raise TraceError(
                f"{user_location()}: Signal barriers must run at the level the Signal was made, "
                "before end()/finish(), never inside a traced if/for/while: each barrier takes "
                "the next epoch, counted when the kernel is traced")
        self._used += 1
        epoch = self._base + self._used
        t = thread_id()
        if t < self.world:
            store(self._slot(self.peers[t], self.rank), epoch, "system", "release")
            spin_until_ge(self._slot(self.self_sig, t), epoch, self.self_sig, self.rank, what)
        barrier()

    def start(self) -> None:
        """Every rank's block has arrived: peers' inputs of this launch may be read. The block
        barrier first makes the release cover what every wave of the block wrote before."""
        barrier()
        self._barrier(layout.WAIT_START)

    def sync(self) -> None:
        """A barrier between phases: what this block wrote before is visible to the peers."""
        barrier()
        self._barrier(layout.WAIT_SYNC)

    def end(self) -> None:
        """Every rank's block is done reading: peers may overwrite what was read.
        Also advances this block's epoch in device memory, so call it last."""
        barrier()
        self._barrier(layout.WAIT_END)
        self.finish()

    def finish(self) -> None:
        """Advance this block's epoch in device memory past the barriers used so far (for a
        kernel that needs no end barrier; `end` does this itself)."""
        if len(state().blocks) != self._depth:
            raise TraceError(f"{user_location()}: Signal.finish() inside a traced if/for/while")
        if thread_id() == 0:
            store(self._epoch_ptr, self._base + self._used)
        self.finished = True
