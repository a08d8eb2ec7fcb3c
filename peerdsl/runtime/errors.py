"""Errors every runtime backend raises (sim, hip, cuda).

Collective errors (what a kernel's error record says, or a collective that could not run)
derive from CollectiveError. After any of them the communicator refuses every later call
with CommunicatorBroken (docs/RELIABILITY.md: the rule after an error).
"""
from __future__ import annotations

from typing import Callable, Sequence

from .. import layout


class CollectiveError(RuntimeError):
    """A collective call failed on this rank; the communicator is broken from now on."""


class CollectiveTimeout(CollectiveError):
    """A bounded spin in a kernel expired; the fields are the kernel's error record
    (`layout.SIG_ERROR`: flag, rank, block, what, expected, seen) read back by the host."""

    def __init__(self, rank: int, block: int, what: int, expected: int, seen: int,
                 kernel: str = "", reporter: int | None = None, peer: int = -1):
        self.rank, self.block, self.what = rank, block, what
        self.expected, self.seen, self.kernel = expected, seen, kernel
        self.reporter = rank if reporter is None else reporter
        self.peer = peer
        name = layout.WAIT_NAMES.get(what, f"wait kind {what}")
        where = f" in kernel {kernel}" if kernel else ""
        on = f" for rank {peer}" if peer >= 0 else ""
        super().__init__(
            f"collective timeout{where}: rank {rank} block {block} gave up waiting on the "
            f"{name}{on}: expected epoch/value >= {expected}, last seen {seen} (a peer never "
            "arrived, or arrived with another epoch: mismatched launches or a Signal shared "
            "by kernels that keep their own counters)")


class CollectiveMismatch(CollectiveError):
    """Ranks launched different calls at the same point (op, dtype, shape, path or sequence
    number differ), or a peer ran barriers this rank did not. Names both sides."""

    def __init__(self, message: str, rank: int = -1, peer: int = -1, tag: int = 0,
                 peer_tag: int = 0, kernel: str = ""):
        self.rank, self.peer, self.tag, self.peer_tag, self.kernel = (rank, peer, tag,
                                                                      peer_tag, kernel)
        super().__init__(message)


class CollectiveAborted(CollectiveError):
    """A peer arrived with the abort mark: one of its waits of this call (or of an earlier
    one) had failed, so nothing it wrote for this call can be trusted."""

    def __init__(self, message: str, rank: int = -1, peer: int = -1, kernel: str = ""):
        self.rank, self.peer, self.kernel = rank, peer, kernel
        super().__init__(message)


class CommunicatorBroken(CollectiveError):
    """Raised by every call after a collective error on this communicator (and after
    close()): its ranks no longer agree on what ran, so it must be closed and rebuilt."""

    def __init__(self, rank: int, first: BaseException | str):
        self.rank, self.first = rank, first
        first_text = first if isinstance(first, str) else f"{type(first).__name__}: {first}"
        super().__init__(
            f"rank {rank}: this communicator is broken since an earlier collective failed "
            f"({first_text}); every later call is refused. Close it and build a new one on "
            "every rank")


class CommunicatorClosed(CommunicatorBroken):
    """A call on a communicator after close()."""

    def __init__(self, rank: int):
        RuntimeError.__init__(self, f"rank {rank}: this communicator was closed; build a new "
                                    "one on every rank")
        self.rank, self.first = rank, "closed"


def error_from_record(words: Sequence[int], kernel: str, reporter: int,
                      describe: Callable[[int], str] | None = None) -> CollectiveError:
    """The error a kernel's record (layout.ERR_* words, flag set) stands for. `describe`
    names a call tag (runtime/callid.py), for the mismatch message."""
    w = [int(x) for x in words] + [0] * (layout.ERROR_WORDS - len(words))
    rank, block, what = w[layout.ERR_RANK], w[layout.ERR_BLOCK], w[layout.ERR_WHAT]
    expected, seen, cause = w[layout.ERR_EXPECTED], w[layout.ERR_SEEN], w[layout.ERR_CAUSE]
    peer, tag = w[layout.ERR_PEER] - 1, w[layout.ERR_TAG] & layout.TAG_MASK
    peer_tag = w[layout.ERR_PEER_TAG] & 0xFFFFFFFF
    if cause == layout.CAUSE_TIMEOUT:
        return CollectiveTimeout(rank, block, what, expected, seen, kernel, reporter, peer)
    name = describe or (lambda t: f"tag {t:#010x}")
    wait = layout.WAIT_NAMES.get(what, f"wait kind {what}")
    where = f" in kernel {kernel}" if kernel else ""
    mine = f"rank {rank} ran {name(tag)}"
    if cause == layout.CAUSE_ABORTED:
        return CollectiveAborted(
            f"collective aborted{where}: {mine}; at its {wait} (block {block}) rank {peer} "
            "arrived with the abort mark: a wait of that rank had failed (its own error says "
            "which), so what it wrote for this call cannot be trusted", rank, peer, kernel)
    if cause == layout.CAUSE_SKEW:
        return CollectiveMismatch(
            f"collective mismatch{where}: {mine}; at its {wait} (block {block}, epoch "
            f"{expected & 0xFFFFFFFF}) rank {peer} was already at epoch {seen & 0xFFFFFFFF}: "
            "it ran barriers this rank did not (a call this rank skipped, or an extra launch "
            "there). Every rank must make the same collective calls in the same order",
            rank, peer, tag, peer_tag & layout.TAG_MASK, kernel)
    return CollectiveMismatch(
        f"collective mismatch{where}: {mine}; at its {wait} (block {block}) rank {peer} sent "
        f"{name(peer_tag & layout.TAG_MASK)}. Every rank must make the same collective calls "
        "in the same order with the same dtype, shape and path", rank, peer, tag,
        peer_tag & layout.TAG_MASK, kernel)


class SimError(RuntimeError):
    """The simulator stopped a launch (the kernel would hang or fault on hardware)."""


class SimMemoryFault(SimError):
    """An access outside every allocation, past the end of one, or misaligned."""


class SimDeadlock(SimError):
    """Every live block spins and nothing can change memory any more."""

    def __init__(self, message: str, waiters: list[dict] | None = None):
        super().__init__(message)
        self.waiters = waiters or []


class SimRace(SimError):
    """Two waves of a block touched the same shared memory without a barrier between."""


class SimHang(SimError):
    """The launch ran past the simulator's hard cap of scheduler steps."""


class SimAborted(SimError):
    """Another rank of the simulated job failed, so this rank's collective cannot run."""


class SimCallMismatch(SimError):
    """Ranks made different host-level collective calls at the same point (a launch on one,
    an exchange on another: e.g. one rank takes the torch.distributed fallback)."""


class SimPeerGone(SimError):
    """A rank waits in a collective call that peers will never make: they returned."""


class SimRendezvousTimeout(SimError):
    """A rank waited longer than the job's rendezvous timeout for its peers to make the same
    collective call (a peer is stuck, dead, or making other calls)."""
