"""Errors every runtime backend raises (sim, hip, cuda)."""
from __future__ import annotations

from .. import layout


class CollectiveTimeout(RuntimeError):
    """A bounded spin in a kernel expired; the fields are the kernel's error record
    (`layout.SIG_ERROR`: flag, rank, block, what, expected, seen) read back by the host."""

    def __init__(self, rank: int, block: int, what: int, expected: int, seen: int,
                 kernel: str = "", reporter: int | None = None):
        self.rank, self.block, self.what = rank, block, what
        self.expected, self.seen, self.kernel = expected, seen, kernel
        self.reporter = rank if reporter is None else reporter
        name = layout.WAIT_NAMES.get(what, f"wait kind {what}")
        where = f" in kernel {kernel}" if kernel else ""
        super().__init__(
            f"collective timeout{where}: rank {rank} block {block} gave up waiting on the "
            f"{name}: expected epoch/value >= {expected}, last seen {seen} (a peer never "
            "arrived, or arrived with another epoch: mismatched launches or a Signal shared "
            "by kernels that keep their own counters)")


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
