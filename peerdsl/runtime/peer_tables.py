"""Device-side tables of every rank's address of a registered buffer.

Kernels whose input is `RegisteredPtrs` read its peers' addresses from one row of this
table at entry; a launch passes the row's address. Row 0 holds the input pool (eager calls
copy into it). Under graph capture each call takes a fresh row and records its own input's
address instead of copying; after capture `register_pending` exchanges the recorded buffers'
IPC handles through the group and fills the rows, so replays read the captured buffers in
place. The rows are plain device memory written outside the graph: nothing captured changes.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .. import layout

ROW_BYTES = 8 * layout.MAX_RANKS


class PeerTables:
    """`rows` rows of `layout.MAX_RANKS` int64 addresses in device memory, for one rank."""

    def __init__(self, rows: int, world: int, rank: int, device: Any):
        if rows < 1:
            raise ValueError(f"a peer table needs at least one row (the input pool), got {rows}")
        self.rows, self.world, self.rank = rows, world, rank
        self.tensor = torch.zeros((rows, layout.MAX_RANKS), dtype=torch.int64, device=device)
        self.base = self.tensor.data_ptr()
        self.next_row = 1
        self.pending: list[tuple[int, int, int]] = []  # (row, own address, bytes)

    def row_address(self, row: int) -> int:
        return self.base + row * ROW_BYTES

    def set_row(self, row: int, addresses: list[int]) -> None:
        if len(addresses) != self.world:
            raise ValueError(f"{len(addresses)} addresses for a world of {self.world}")
        padded = layout.peer_row(addresses)
        self.tensor[row].copy_(torch.tensor(padded, dtype=torch.int64))

    def reserve(self, address: int, nbytes: int) -> int:
        """A fresh row for a buffer captured at `address`; returns the row's device address.
        The row is filled by `register_pending` after the capture."""
        if self.next_row >= self.rows:
            raise RuntimeError(
                f"all {self.rows - 1} graph-buffer rows are taken: more collective calls were "
                "captured than the communicator holds rows for; pass a larger "
                "Communicator(max_graph_buffers=...)")
        row = self.next_row
        self.next_row += 1
        self.pending.append((row, address, nbytes))
        return self.row_address(row)

    def reset(self) -> None:
        """Free every row but the pool's (the buffers they name are no longer read)."""
        self.tensor[1:self.next_row].zero_()
        self.next_row, self.pending = 1, []

    def discard_pending(self) -> None:
        """Forget the rows reserved since the last registration (a capture that failed)."""
        if self.pending:
            self.next_row = self.pending[0][0]
        self.pending = []

    def register_pending(self, exchange: Callable[[Any], list],
                         export: Callable[[int, int], bytes],
                         open_peer: Callable[[bytes], int], failure: str | None = None) -> int:
        """Collective: share every captured buffer with the peers and fill its row.
        `exchange(obj)` all-gathers a picklable object, `export(address, nbytes)` gives the
        wire form of an IPC handle, `open_peer(wire)` maps a peer's buffer here. A rank whose
        capture failed passes `failure` (it still takes part, so no peer waits for it) and
        every rank then raises. Returns how many rows were filled."""
        pending = self.pending
        mine: Any = failure
        if failure is None:
            try:
                mine = [(export(address, nbytes), nbytes) for _, address, nbytes in pending]
            except Exception as e:  # noqa: BLE001 - sent to the peers, then raised here
                mine = f"rank {self.rank}: {e}"
        everyone = exchange(mine)
        failed = [f for f in everyone if isinstance(f, str)]
        if failed:
            self.discard_pending()
            raise RuntimeError("graph buffer registration failed on "
                               f"{len(failed)} rank(s): " + "; ".join(failed))
        sizes = [[n for _, n in handles] for handles in everyone]
        if any(s != sizes[0] for s in sizes):
            self.discard_pending()
            counts = [len(s) for s in sizes]
            raise RuntimeError(
                f"ranks captured different collective calls ({counts} calls by rank, or "
                "inputs of different sizes): every rank must capture the same calls in the "
                "same order")
        rows = torch.zeros((len(pending), layout.MAX_RANKS), dtype=torch.int64)
        for i, (_, address, _) in enumerate(pending):
            for r in range(self.world):
                rows[i, r] = address if r == self.rank else open_peer(everyone[r][i][0])
        if pending:  # reserved one after another: one copy
            first = pending[0][0]
            self.tensor[first:first + len(pending)].copy_(rows)
        self.pending = []
        return len(pending)
