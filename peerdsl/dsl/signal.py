"""The Signal: the only way a kernel synchronizes with its peers (SPEC section 3; the fault
rules and why they are safe: docs/RELIABILITY.md).

Per-block epochs live in device memory (the Signal's epoch words), so graph replay and
kernels of different kinds sharing the Signal all advance the same counters. A barrier
arrival is one 8-byte release store of {epoch, tag} into the peer's slot (relaxed for a
start barrier before the kernel's first write: `Signal.start`; the tag names the call:
`dsl.CallId`); the wait acquires until the slot's epoch has reached the target,
compared wrap-safely (`wge`: the sign of the 32-bit difference), then checks in registers:

  - epoch == target, tag != this call's tag  -> mismatch: the ranks launched different calls
  - the tag carries TAG_ABORT                -> the peer's block had already failed
  - epoch > target + 1                       -> skew: the peer ran barriers this rank did not
  - epoch == target + 1                      -> the peer passed `target`, which it does only
    after checking this rank's tag there (else it would send TAG_ABORT): it vouches for it

A block whose wait failed, or any block of a rank whose error record was already set when
the kernel started, sends TAG_ABORT in every later arrival, and `bound()` turns its data
loops off: no peer consumes what it wrote, and it reads nothing a peer may not have staged
(or sized). Every spin is bounded by the host-set spin limit and stops early once any wait
of this rank has failed; the first failing wait writes the error record the host reads.
"""
from __future__ import annotations

from typing import Any

from .. import layout
from . import ir
from .builder import TraceError, state, user_location
from .intrinsics import block_id, select, shared_array, thread_id
from .kernel import PeerTable
from .memory import atomic_cas, barrier, load, load_run, store
from .values import Pointer, Scalar, _compare, as_scalar, declare_own_rank


def wlt(a: Any, b: Any) -> Scalar:
    """Counter a is before counter b, wrap-safely: (a - b) as a signed difference < 0."""
    return _compare("wlt", a, b)


def wge(a: Any, b: Any) -> Scalar:
    """Counter a has reached counter b, wrap-safely: (a - b) as a signed difference >= 0."""
    return _compare("wge", a, b)


def record_error(sig: Pointer, rank: Any, what: int, expected: Any, seen: Any,
                 cause: Any = layout.CAUSE_TIMEOUT, peer: Any = -1, tag: Any = 0,
                 peer_tag: Any = 0) -> None:
    """Write the error record (layout.ERR_*) unless another wait already did."""
    err = sig + layout.SIG_ERROR
    if atomic_cas(err, 0, 1, "system", "acq_rel") == 0:
        for word, value in ((layout.ERR_RANK, rank), (layout.ERR_BLOCK, block_id()),
                            (layout.ERR_WHAT, what), (layout.ERR_EXPECTED, expected),
                            (layout.ERR_SEEN, seen), (layout.ERR_CAUSE, cause),
                            (layout.ERR_PEER, peer + 1), (layout.ERR_TAG, tag),
                            (layout.ERR_PEER_TAG, peer_tag)):
            store(err + word, value, "system", "relaxed")


def spin_limit(sig: Pointer) -> Scalar:
    """The host's spin limit, or 0 once any spin of this rank has expired: after the first
    timeout every later wait gives up at once, so a dead peer costs one timeout, not one per
    wait."""
    expired = load(sig + layout.SIG_ERROR, "system", "relaxed")
    return select(expired != 0, 0, load(sig + layout.SIG_SPIN_LIMIT))


def staged_ok(sig: PeerTable, rank: Any) -> Scalar:
    """True when this rank's error record is clear as the launch finds it. A kernel with no
    barrier of its own that reads what an earlier launch's barriers staged (peers' staging
    after that launch's phase barrier) bounds its data loops with this, as Signal.bound()
    does: a wait of that launch that failed wrote the record before the launch ended, so
    nothing a peer may not have staged is read, and no output of the call is written."""
    rank = as_scalar(rank)
    declare_own_rank(rank)
    return load(sig[rank] + layout.SIG_ERROR) == 0


def spin_until_ge(flag: Pointer, target: Any, sig: Pointer, rank: Any, what: int) -> Scalar:
    """Acquire-load the counter `flag` until it has reached target (wrap-safe), at most the
    host's spin limit times. Returns 1 when the wait succeeded, 0 when it expired (an error
    record is then written)."""
    limit = spin_limit(sig)
    seen = load(flag, "system", "acquire")
    n = 0
    while wlt(seen, target) and (n < limit):
        seen = load(flag, "system", "acquire")
        n = n + 1
    ok = wge(seen, target)
    if not ok:
        record_error(sig, rank, what, target, seen)
    return ok.to_i32()


def _wait_slot(slot: Pointer, target: Scalar, tag: Scalar, limit: Any, sig: Pointer,
               rank: Scalar, peer: Any, what: int) -> Scalar:
    """Wait until the 8-byte slot {epoch, tag} has reached `target`; True when the peer's
    arrival agrees with this call (the module docstring's rules), else the record is written.
    The loop stops early once any wait of this rank has failed (the error flag is set)."""
    err = sig + layout.SIG_ERROR
    v = load(slot, "system", "acquire")
    seen = v.to_i32()
    n = 0
    stop = 0
    while wlt(seen, target) and (n < limit) and (stop == 0):
        # the flag's relaxed load goes first: after the acquire it could not issue until the
        # acquire returned, two round trips per poll instead of one
        stop = load(err, "system", "relaxed")
        v = load(slot, "system", "acquire")
        seen = v.to_i32()
        n = n + 1
    peer_tag = (v >> 32).to_i32()
    ahead = (seen - target) > 1
    aborted = (peer_tag & layout.TAG_ABORT) != 0
    differs = ((seen - target) == 0) & (peer_tag != tag)
    reached = wge(seen, target)
    ok = reached & ~ahead & ~aborted & ~differs
    if not ok:
        cause = select(reached, select(aborted, layout.CAUSE_ABORTED,
                                       select(ahead, layout.CAUSE_SKEW,
                                              layout.CAUSE_MISMATCH)),
                       layout.CAUSE_TIMEOUT)
        record_error(sig, rank, what, target, seen, cause, peer, tag, peer_tag)
    return ok


class Signal:
    """Barriers between the blocks of the same index on every rank.

    `sig` is the peer table of every rank's Signal base (i32 words); `rank` this rank,
    `world` a constexpr, `call` the kernel's `dsl.CallId` parameter (None: a constant tag,
    for kernels launched outside the runtime's collectives). Each barrier of a launch uses
    the next epoch of this block's device-side counter (one slot array, values compared
    wrap-safely), so kernels of any kind sharing the Signal can never release each other's
    barriers early, and every arrival carries the call's tag for the peers to check.
    """

    def __init__(self, sig: PeerTable, rank: Any, world: int, call: Any = None):
        if not isinstance(world, int) or not 1 <= world <= layout.MAX_RANKS:
            raise ValueError(f"world size {world!r} must be a constant in [1, {layout.MAX_RANKS}]")
        self.peers = sig
        self.rank = as_scalar(rank)
        declare_own_rank(self.rank)  # sig[rank] and friends are this rank's own memory
        self.world = world
        self.tag = as_scalar(0 if call is None else call)
        if self.tag.type != ir.i32:
            raise TraceError(f"{user_location()}: Signal call= takes the kernel's dsl.CallId "
                             f"parameter (i32), got {self.tag.type}")
        self.self_sig = sig[self.rank]
        self.block = block_id()
        self._epoch_ptr = self.self_sig + (layout.SIG_EPOCH + self.block)
        self._base = load(self._epoch_ptr)
        # The rank's error flag and spin limit as the launch found them: plain loads issued
        # with the epoch's (no added latency). A set flag means a wait of an earlier kernel
        # failed: then every arrival of this kernel sends TAG_ABORT.
        self._sticky = load(self.self_sig + layout.SIG_ERROR)
        self._limit = load(self.self_sig + layout.SIG_SPIN_LIMIT)
        self._used = 0
        self.finished = False
        st = state()
        # per barrier (double-buffered by its parity), whether each waiting thread's wait and
        # every earlier one of this block succeeded: the block-wide verdict is their AND
        self._oks = shared_array(f"signal{len(st.signals)}_ok", ir.i32, 2 * layout.MAX_RANKS)
        self._depth = len(st.blocks)
        st.signals.append(self)

    def _slot(self, owner: Pointer, peer: Any) -> Pointer:
        """The 8-byte {epoch, tag} word in `owner`'s Signal that `peer` writes for this block."""
        return owner.cast(ir.i64) + (layout.SIG_SLOTS // layout.SLOT_WORDS
                                     + self.block * layout.MAX_RANKS + peer)

    def _ok_after(self, k: int) -> Scalar:
        """True when the rank's record was clear at launch and every wait of this block's
        first k barriers succeeded (every thread may ask once barrier k's block barrier
        has passed)."""
        ok = self._sticky == 0
        if k > 0:
            for flag in load_run(self._oks + (k & 1) * layout.MAX_RANKS, self.world):
                ok = ok & (flag != 0)
        return ok

    def _barrier(self, what: int, order: str = "release") -> None:
        if len(state().blocks) != self._depth or self.finished:
            raise TraceError(
                f"{user_location()}: Signal barriers must run at the level the Signal was made, "
                "before end()/finish(), never inside a traced if/for/while: each barrier takes "
                "the next epoch, counted when the kernel is traced")
        self._used += 1
        k = self._used
        epoch = self._base + k
        t = thread_id()
        if t < self.world:
            ok_before = self._ok_after(k - 1)
            tag = select(ok_before, self.tag, self.tag | layout.TAG_ABORT)
            word = (tag.zext(ir.i64) << 32) | epoch.zext(ir.i64)
            store(self._slot(self.peers[t], self.rank), word, "system", order)
            ok = _wait_slot(self._slot(self.self_sig, t), epoch, self.tag,
                            select(ok_before, self._limit, 0), self.self_sig, self.rank, t,
                            what)
            store(self._oks + ((k & 1) * layout.MAX_RANKS) + t, (ok_before & ok).zext(ir.i32))
        barrier()

    def start(self) -> None:
        """Every rank's block has arrived: peers' inputs of this launch may be read. The block
        barrier first makes the release cover what every wave of the block wrote before (none
        where the kernel has written nothing).
        Where the kernel has written nothing yet (traced no store or atomic), the arrival is
        a relaxed system-scope store: what peers read was written by earlier launches, which
        the launch boundary publishes, and a release would only add a system fence (the
        waits stay acquire, SPEC section 3)."""
        writes = state().writes
        if writes:  # the release covers every wave's stores only after a block barrier
            barrier()
        self._barrier(layout.WAIT_START, "release" if writes else "relaxed")

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

    def bound(self, n: Any) -> Any:
        """`n` when every barrier of this block so far succeeded, else 0. Loops that read
        peers' memory (or write what peers read) after a barrier take their bound from
        here, so a block whose wait failed touches nothing a peer did not stage for it."""
        if self._used == 0:
            raise TraceError(f"{user_location()}: Signal.bound() before the first barrier")
        return select(self._ok_after(self._used), n, 0)

    def finish(self) -> None:
        """Advance this block's epoch in device memory past the barriers used so far (for a
        kernel that needs no end barrier; `end` does this itself)."""
        if len(state().blocks) != self._depth:
            raise TraceError(f"{user_location()}: Signal.finish() inside a traced if/for/while")
        if thread_id() == 0:
            store(self._epoch_ptr, self._base + self._used)
        self.finished = True
