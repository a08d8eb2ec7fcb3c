"""Graph capture with buffers registered after the capture, for the GPU Communicator.

Captured calls record their inputs' addresses in fresh rows of the device-side peer tables
(runtime/peer_tables.py) instead of copying into the pool; when `graph_capture()` exits,
every rank shares the recorded buffers through the group and the rows are filled, so
replays read the captured buffers in place. Uses the Communicator's `tables`, `_dist`,
`group`, `rank`, `world`, `device`, `dev_index`, `_capturing`, `_graph_opened`,
`_graph_inputs` and `_stream_capturing()`. Capture from one thread per communicator (as
torch's graph capture itself expects): the row reservation is not locked.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch


class GraphCapture:
    @contextlib.contextmanager
    def graph_capture(self) -> Iterator[None]:
        """Wrap `torch.cuda.graph(...)` captures (any number) in this, on every rank:

            with comm.graph_capture():
                with torch.cuda.graph(g):
                    y = comm.fused_allreduce_rmsnorm(x, residual, weight)

        Captured calls read their inputs in place (no copy into the pool); their buffers are
        registered with the peers when this context exits, which is collective. Eager calls
        inside (warm-up) behave as outside. A replay cannot raise: call `check_errors()`
        after replays (the next eager call also does)."""
        if self._capturing:
            raise RuntimeError("comm.graph_capture() is already open: nest torch.cuda.graph() "
                               "captures inside one graph_capture(), not graph_capture()s")
        self._capturing = True
        try:
            yield
        except BaseException as e:
            self._capturing = False
            if not self._stream_capturing():  # peers wait for this rank at the exchange
                with contextlib.suppress(RuntimeError):  # this rank raises its own error
                    self.register_graph_buffers(failure=f"rank {self.rank}: {e!r}")
            self.tables.discard_pending()
            raise
        self._capturing = False
        if self._stream_capturing():
            self.tables.discard_pending()
            raise RuntimeError("comm.graph_capture() ended while a CUDA graph capture is still "
                               "running: enter graph_capture() outside torch.cuda.graph(), so "
                               "buffers are registered after the capture ends")
        self.register_graph_buffers()

    def register_graph_buffers(self, failure: str | None = None) -> int:
        """Collective: give the peers every input captured since the last call and fill
        their table rows. graph_capture() calls it (with `failure` when this rank's capture
        raised, so every rank raises instead of waiting); returns how many buffers."""
        from .cuda.ipc import IpcHandle, ipc_export, ipc_open

        def export(address: int, nbytes: int) -> bytes:
            try:
                return ipc_export(address, nbytes, device=self.dev_index).to_bytes()
            except Exception as e:
                raise RuntimeError(
                    f"the captured input at {address:#x} ({nbytes} bytes) cannot be shared by "
                    "CUDA IPC (is torch's expandable_segments allocator on? it gives VMM "
                    f"memory IPC handles cannot export): {e}") from e

        def open_peer(wire: bytes) -> int:
            address = ipc_open(IpcHandle.from_bytes(wire), device=self.dev_index)
            self._graph_opened.append(address)
            return address

        def exchange(obj: Any) -> list:
            out: list[Any] = [None] * self.world
            self._dist.all_gather_object(out, obj, group=self.group)
            return out

        return self.tables.register_pending(exchange, export, open_peer, failure)

    def release_graph_buffers(self) -> None:
        """Collective: forget every buffer registered by graph captures, once the graphs that
        read them are gone (a serving engine re-capturing its graphs calls this first): the
        peers' mappings are closed, the table rows freed for new captures."""
        if self._capturing:
            raise RuntimeError("release_graph_buffers() inside graph_capture()")
        torch.cuda.synchronize(self.device)
        self._dist.barrier(group=self.group)  # no rank replays a graph that reads them
        self._drop_graph_buffers()
        self._dist.barrier(group=self.group)

    def _drop_graph_buffers(self) -> None:
        from .cuda.ipc import ipc_close
        opened, self._graph_opened, self._graph_inputs = self._graph_opened, [], []
        for addr in opened:
            ipc_close(addr)
        self.tables.reset()
