"""Peer-visible buffers for user launches: `PeerBuffer` (every rank's address of one buffer,
the value a PeerPtrs parameter takes) and the GPU Communicator's `register`, `peer_buffer`
and `signal`.

On the GPU, `register(tensor)` shares an existing tensor's memory with the peers through the
group (CUDA IPC handles, as graph-captured inputs are shared) and `peer_buffer(shape, dtype)`
allocates zeroed memory shared the way the meta buffer is (IPC, or file descriptors of a
cuMemCreate allocation with allocator="vmm"). Both are collective. The peers' mappings are
released by `close()`. The simulator's versions are in sim/user_launch.py.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

from .. import layout


class PeerBuffer(Sequence):
    """Every rank's address of one buffer (index = rank), with this rank's part as `tensor`.

    Pass it for a PeerPtrs parameter (or for a Ptr / RegisteredPtrs one: this rank's memory /
    the peers' table). `tensor`: on the GPU the memory itself; on the simulator a CPU tensor
    the communicator copies to the device before each `comm.launch` and back after it; None
    for the communicator's Signal."""

    def __init__(self, addresses: Sequence[int], rank: int, dtype: Any, shape: tuple,
                 tensor: Any = None, name: str = ""):
        self.addresses = tuple(int(a) for a in addresses)
        self.rank, self.dtype, self.shape = rank, dtype, tuple(shape)
        self.tensor = tensor
        self.name = name
        self.table: Any = None   # the peers' table for a RegisteredPtrs parameter, made on use
        self.backing: Any = None  # what keeps the memory alive (a backend's own handle)

    @property
    def address(self) -> int:
        """This rank's address."""
        return self.addresses[self.rank]

    @property
    def nbytes(self) -> int:
        import torch
        return math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()

    def __getitem__(self, i: Any) -> Any:
        return self.addresses[i]

    def __len__(self) -> int:
        return len(self.addresses)

    def __repr__(self) -> str:
        what = f"{self.name} " if self.name else ""
        return (f"PeerBuffer({what}{str(self.dtype).replace('torch.', '')} {self.shape}, "
                f"{len(self.addresses)} ranks, rank {self.rank} at {self.address:#x})")


class PeerBuffers:
    """The GPU Communicator's peer buffers. Uses `_dist`, `group`, `rank`, `world`, `device`,
    `dev_index`, `allocator`, `signal_peers`; `close()` calls `_release_peer_buffers()`."""

    @functools.cached_property
    def signal(self) -> PeerBuffer:
        """The communicator's Signal as a PeerPtrs value (what `dsl.Signal(sig, ...)` takes)."""
        import torch
        return PeerBuffer(self.signal_peers, self.rank, torch.int32,
                          (layout.SIGNAL_BYTES // 4,), None, "signal")

    def register(self, tensor: Any) -> PeerBuffer:
        """Collective: share `tensor`'s memory with every rank; its PeerBuffer (the tensor
        stays this rank's part: what the peers write into it lands there)."""
        import torch
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"register takes a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device.type != self.device.type or (tensor.device.index or 0) != self.dev_index:
            raise ValueError(f"register: the tensor is on {tensor.device}; this communicator "
                             f"runs on {self.device}")
        if not tensor.is_contiguous():
            raise ValueError("register: the tensor is not contiguous (peers address it as one "
                             "flat buffer): pass t.contiguous()")
        addresses = self._share_by_ipc(tensor.data_ptr(),
                                       tensor.numel() * tensor.element_size())
        return PeerBuffer(addresses, self.rank, tensor.dtype, tuple(tensor.shape), tensor)

    def peer_buffer(self, shape: Sequence[int] | int, dtype: Any) -> PeerBuffer:
        """Collective: zeroed peer-visible memory of `shape` and `dtype` on every rank."""
        import torch
        shape = (shape,) if isinstance(shape, int) else tuple(int(s) for s in shape)
        if self.allocator != "vmm":
            tensor = torch.zeros(shape, dtype=dtype, device=self.device)
            torch.cuda.synchronize(self.device)  # zeroed before any peer may write into it
            return self.register(tensor)
        nbytes = max(1, math.prod(shape) * torch.empty((), dtype=dtype).element_size())
        own, addresses = self._share_by_vmm(nbytes)
        from .communicator import _device_bytes
        raw = _device_bytes(own.ptr, own.size, self.device)
        raw.zero_()
        tensor = raw[:math.prod(shape) * torch.empty((), dtype=dtype).element_size()] \
            .view(dtype).view(shape)
        torch.cuda.synchronize(self.device)
        self._dist.barrier(group=self.group)  # zeroed everywhere before a peer writes
        return PeerBuffer(addresses, self.rank, dtype, shape, tensor)

    # ------------------------------------------------------------------ sharing
    def _peer_state(self) -> dict[str, list]:
        state = self.__dict__.get("_peer_buffer_state")
        if state is None:
            state = self.__dict__["_peer_buffer_state"] = {"ipc": [], "vmm": [], "own": [],
                                                           "tables": []}
        return state

    def _exchange(self, obj: Any) -> list:
        out: list[Any] = [None] * self.world
        self._dist.all_gather_object(out, obj, group=self.group)
        return out

    def _share_by_ipc(self, address: int, nbytes: int) -> list[int]:
        from .cuda.ipc import IpcHandle, ipc_close, ipc_export, ipc_open
        try:
            mine: Any = ipc_export(address, nbytes, device=self.dev_index).to_bytes()
        except Exception as e:  # noqa: BLE001 - sent to the peers (none waits), then raised
            mine = (f"rank {self.rank}: {address:#x} ({nbytes} bytes) cannot be shared by CUDA "
                    f"IPC (torch's expandable_segments allocator gives memory IPC cannot "
                    f"export; Communicator(allocator='vmm') + peer_buffer() avoids it): {e}")
        everyone = self._exchange(mine)
        failed = [w for w in everyone if isinstance(w, str)]
        if failed:
            raise RuntimeError("register failed: " + "; ".join(failed))
        opened, addresses = [], []
        try:
            for r, wire in enumerate(everyone):
                if r == self.rank:
                    addresses.append(address)
                else:
                    addresses.append(ipc_open(IpcHandle.from_bytes(wire), device=self.dev_index))
                    opened.append(addresses[-1])
        except BaseException:
            for a in opened:
                ipc_close(a)
            raise
        self._peer_state()["ipc"].extend(opened)
        return addresses

    def _share_by_vmm(self, nbytes: int) -> tuple[Any, list[int]]:
        from .cuda import vmm
        own = vmm.vmm_alloc(nbytes, self.dev_index)
        self._peer_state()["own"].append(own)
        addresses, mapped = vmm.share_with_peers(
            own, self.rank, self.world,
            lambda out, obj: self._dist.all_gather_object(out, obj, group=self.group),
            self.dev_index)
        self._peer_state()["vmm"].extend(mapped)
        return own, addresses

    def _registered_table(self, buf: PeerBuffer) -> int:
        """The device address of `buf`'s peers' table (a RegisteredPtrs value), made once."""
        if buf.table is None:
            import torch
            buf.table = torch.tensor(layout.peer_row(list(buf.addresses)), dtype=torch.int64,
                                     device=self.device)
            self._peer_state()["tables"].append(buf.table)
        return buf.table.data_ptr()

    def _release_peer_buffers(self) -> None:
        """close(): unmap the peers' buffers (no peer reads any more: close() synchronized)."""
        state = self.__dict__.pop("_peer_buffer_state", None)
        if not state:
            return
        if state["ipc"]:
            from .cuda.ipc import ipc_close
            for a in state["ipc"]:
                ipc_close(a)
        if state["vmm"] or state["own"]:
            from .cuda import vmm
            for mapped in state["vmm"] + state["own"]:
                vmm.vmm_free(mapped)
