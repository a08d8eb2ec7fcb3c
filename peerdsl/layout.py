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
# every wait compares wrap-safely (the sign of the 32-bit difference: docs/RELIABILITY.md),
# so the values only move forward whatever kernels share the Signal. A slot is one 8-byte
# word {epoch, tag} stored with one release store: the tag (the call's identity, or with
# TAG_ABORT set when the sender's block already failed) lands with the epoch it belongs to.
SLOT_WORDS = 2
SIG_SLOTS = 0                                   # [MAX_BLOCKS][MAX_RANKS] {epoch, tag} from peer
SIG_EPOCH = SIG_SLOTS + MAX_BLOCKS * MAX_RANKS * SLOT_WORDS  # [MAX_BLOCKS]: block epochs
# [MAX_BLOCKS]: the one LL epoch, kept as a copy per block index. Every LL launch reads its
# block's copy and writes the next value into every copy (block b of a G-block launch writes
# copies b, b + G, b + 2G, ...: only ones that no other block of the launch reads), so all
# copies stay equal whatever the grids, with no atomic and no fence in the kernel.
SIG_LL_EPOCH = SIG_EPOCH + MAX_BLOCKS
SIG_SPIN_LIMIT = SIG_LL_EPOCH + MAX_BLOCKS      # iterations a spin may take (set by the host)
SIG_ERROR = SIG_SPIN_LIMIT + 1                  # the error record, ERROR_WORDS words:
ERR_FLAG, ERR_RANK, ERR_BLOCK, ERR_WHAT, ERR_EXPECTED, ERR_SEEN = range(6)
ERR_CAUSE, ERR_PEER, ERR_TAG, ERR_PEER_TAG = range(6, 10)  # ERR_PEER: peer + 1 (0: none)
ERROR_WORDS = 10
SIGNAL_WORDS = SIG_ERROR + ERROR_WORDS
SPARE_WORDS = MAX_BLOCKS    # words after SIGNAL_WORDS no protocol touches (tests' own counters)
SIGNAL_BYTES = ((SIGNAL_WORDS + SPARE_WORDS) * 4 + 4095) // 4096 * 4096

# what a spin waited for, in the error record
WAIT_START, WAIT_END, WAIT_LL, WAIT_FLAG, WAIT_SYNC = 1, 2, 3, 4, 5
WAIT_NAMES = {WAIT_START: "start barrier", WAIT_END: "end barrier", WAIT_LL: "LL line",
              WAIT_FLAG: "flag", WAIT_SYNC: "phase barrier"}

# why a wait failed (ERR_CAUSE); 0 keeps the meaning every record had before: a timeout
CAUSE_TIMEOUT = 0   # the peer never arrived within the spin limit
CAUSE_MISMATCH = 1  # the peer arrived at this epoch with another call's tag
CAUSE_ABORTED = 2   # the peer arrived with TAG_ABORT: one of its waits had failed
CAUSE_SKEW = 3      # the peer is more than one barrier ahead: it ran barriers this rank did not

# Call tags (31 bits, computed by the host for every collective call: runtime/callid.py).
# TAG_ABORT marks an arrival or LL line of a rank whose wait already failed: peers that see it
# raise instead of consuming what that rank wrote.
TAG_MASK = 0x7FFFFFFF
TAG_ABORT = 1 << 31


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
