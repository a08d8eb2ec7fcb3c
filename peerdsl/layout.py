"""The per-rank meta buffer (SPEC section 4), shared by the kernels and every runtime backend.

    [Signal | LL scratch: 2 banks x world x packets x 16 B | staging]

Offsets are bytes from the start of the meta buffer. The Signal is a block of i32 words.
"""
from __future__ import annotations

import dataclasses

MAX_RANKS = 8
MAX_BLOCKS = 256            # grid limit of every collective kernel
LL_MAX_BYTES = 4 << 20      # SPEC: LL range cap
STAGING_BYTES = 16 << 20
LL_LINE_BYTES = 16          # {data0, flag, data1, flag}
LL_DATA_PER_LINE = 8        # 2 data words per line


def peer_row(addresses: list[int]) -> list[int]:
    """One row of a RegisteredPtrs table: every rank's address, zero-padded to MAX_RANKS."""
    if len(addresses) > MAX_RANKS:
        raise ValueError(f"{len(addresses)} addresses exceed the {MAX_RANKS} a row holds")
    return list(addresses) + [0] * (MAX_RANKS - len(addresses))


# Signal words (i32 index). One slot array: barrier k of a launch writes epoch base+k, and
# every wait compares with >=, so the values only grow whatever kernels share the Signal.
SIG_SLOTS = 0                                   # [MAX_BLOCKS][MAX_RANKS]: epoch from peer
SIG_EPOCH = SIG_SLOTS + MAX_BLOCKS * MAX_RANKS  # [MAX_BLOCKS]: this rank's block epochs
SIG_LL_EPOCH = SIG_EPOCH + MAX_BLOCKS           # one LL epoch shared by every LL launch
SIG_LL_DONE = SIG_LL_EPOCH + 1                  # blocks of the current LL launch that finished
SIG_SPIN_LIMIT = SIG_LL_DONE + 1                # iterations a spin may take (set by the host)
SIG_ERROR = SIG_SPIN_LIMIT + 1                  # [8]: flag, rank, block, what, expected, seen
ERROR_WORDS = 8
SIGNAL_WORDS = SIG_ERROR + ERROR_WORDS
SIGNAL_BYTES = (SIGNAL_WORDS * 4 + 4095) // 4096 * 4096

# what a spin waited for, in the error record
WAIT_START, WAIT_END, WAIT_LL, WAIT_FLAG, WAIT_SYNC = 1, 2, 3, 4, 5
WAIT_NAMES = {WAIT_START: "start barrier", WAIT_END: "end barrier", WAIT_LL: "LL line",
              WAIT_FLAG: "flag", WAIT_SYNC: "phase barrier"}


def ll_packets(ll_max_bytes: int = LL_MAX_BYTES) -> int:
    """LL lines needed per (bank, peer) to carry ll_max_bytes of payload."""
    return ll_max_bytes // LL_DATA_PER_LINE


@dataclasses.dataclass(frozen=True)
class MetaLayout:
    world: int
    ll_max_bytes: int = LL_MAX_BYTES
    staging_bytes: int = STAGING_BYTES

    @property
    def signal_offset(self) -> int:
        return 0

    @property
    def ll_offset(self) -> int:
        return SIGNAL_BYTES

    @property
    def ll_bank_bytes(self) -> int:
        return self.world * ll_packets(self.ll_max_bytes) * LL_LINE_BYTES

    @property
    def ll_bytes(self) -> int:
        return 2 * self.ll_bank_bytes

    @property
    def staging_offset(self) -> int:
        return self.ll_offset + self.ll_bytes

    @property
    def total_bytes(self) -> int:
        return self.staging_offset + self.staging_bytes
