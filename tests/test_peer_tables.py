"""The device-side peer tables (runtime/peer_tables.py) that graph capture fills after the
capture: row layout, registration through an exchange, and the errors a user can act on."""
from __future__ import annotations

import pytest

from peerdsl import layout
from peerdsl.runtime.peer_tables import ROW_BYTES, PeerTables


def _tables(rank=1, world=4, rows=4):
    return PeerTables(rows, world, rank, "cpu")


def test_rows_are_max_ranks_addresses_wide():
    t = _tables()
    assert ROW_BYTES == 8 * layout.MAX_RANKS
    assert t.row_address(2) - t.row_address(0) == 2 * ROW_BYTES
    t.set_row(0, [16, 32, 48, 64])
    assert t.tensor[0].tolist() == [16, 32, 48, 64, 0, 0, 0, 0]
    with pytest.raises(ValueError, match="world of 4"):
        t.set_row(0, [16, 32])


def test_register_pending_fills_each_rank_column():
    t = _tables(rank=1, world=3)
    a1, a2 = t.reserve(0x1000, 64), t.reserve(0x2000, 128)
    assert (a1, a2) == (t.row_address(1), t.row_address(2))
    exported = []

    def export(addr, n):
        exported.append((addr, n))
        return f"{addr}:{n}".encode()

    # rank r's handle for buffer i opens at r * 0x100000 + its own address
    def exchange(mine):
        return [list(mine) for _ in range(3)]

    opened = iter(range(1, 100))
    assert t.register_pending(exchange, export, lambda w: next(opened) << 40) == 2
    assert exported == [(0x1000, 64), (0x2000, 128)]
    assert t.tensor[1, :3].tolist() == [1 << 40, 0x1000, 2 << 40]
    assert t.tensor[2, :3].tolist() == [3 << 40, 0x2000, 4 << 40]
    assert not t.pending


def test_ranks_that_captured_different_calls_are_told_so():
    t = _tables(rank=0, world=2)
    t.reserve(0x1000, 64)
    with pytest.raises(RuntimeError, match=r"different collective calls \(\[1, 2\] calls"):
        t.register_pending(lambda mine: [mine, mine * 2], lambda a, n: b"h", lambda w: 1)
    assert t.next_row == 1 and not t.pending  # the failed capture's rows are free again
    t.reserve(0x1000, 64)
    with pytest.raises(RuntimeError, match="inputs of different sizes"):
        t.register_pending(lambda mine: [mine, [(b"h", 128)]], lambda a, n: b"h", lambda w: 1)


def test_a_failed_rank_still_exchanges_and_every_rank_raises():
    t = _tables(rank=0, world=2)
    t.reserve(0x1000, 64)
    sent = []

    def exchange(mine):
        sent.append(mine)
        return [mine, [(b"h", 64)]]
    with pytest.raises(RuntimeError, match="failed on 1 rank"):
        t.register_pending(exchange, lambda a, n: b"h", lambda w: 1, failure="rank 0: boom")
    assert sent == ["rank 0: boom"] and t.next_row == 1

    def cannot_export(a, n):
        raise OSError("expandable segments")
    t.reserve(0x1000, 64)
    with pytest.raises(RuntimeError, match="rank 0: expandable segments"):
        t.register_pending(lambda mine: [mine, [(b"h", 64)]], cannot_export, lambda w: 1)


def test_running_out_of_rows_names_the_setting():
    t = _tables(rows=2)
    t.reserve(0x1000, 64)
    with pytest.raises(RuntimeError, match="max_graph_buffers"):
        t.reserve(0x2000, 64)
