"""The simulator's Communicator with the collective methods (runtime/collectives.py) on top
of SimCommunicator's memory and launch primitives. Tensors in and out are torch CPU tensors."""
from __future__ import annotations

from typing import Any

import torch

from ... import layout
from ...ops.registry import load_all
from ..built import from_registry
from ..collectives import Collectives
from .comm import SimCommunicator
from .device import DeviceBuffer


class SimCollectiveComm(SimCommunicator, Collectives):
    """`peerdsl.sim.run`'s communicator: all_reduce, all_gather, fused_allreduce_rmsnorm, ..."""

    max_grid = 4  # blocks per launch: enough to exercise several blocks, small enough to be fast
    max_local_grid = 4

    @classmethod
    def check_job(cls, world: int, target: str) -> None:
        """Called when a SimJob is made: the world must be one the collectives are built for
        (the registry's variants for the target, as `peerdsl build` would build them)."""
        from_registry(target).check_world(world)

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.arch = self.target
        self._pool: DeviceBuffer | None = None
        self._pool_peers: list[int] = []
        # the registered-input table the RegisteredPtrs kernels read (layout.MAX_RANKS wide)
        self._pool_table = self.alloc((layout.MAX_RANKS,), torch.int64, "pool peer table")
        self._ops = load_all()

    @property
    def meta_bases(self) -> list[int]:
        return self.peer_meta

    def _dev(self, t: torch.Tensor) -> DeviceBuffer:
        return self.to_device(t.contiguous())

    def _addr(self, buf: DeviceBuffer) -> int:
        return buf.addr

    def _new(self, shape: tuple, dtype: torch.dtype) -> DeviceBuffer:
        return self.alloc(shape, dtype)

    def _get(self, buf: DeviceBuffer, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return self.to_torch(buf, shape, dtype)

    @property
    def pool_peers(self) -> list[int]:
        return self._pool_peers

    def _stage(self, t: torch.Tensor) -> int:
        """Copy t into this rank's registered input pool (grown, and re-registered, on demand:
        every rank stages the same sizes in the same order, so the growth is collective)."""
        t = t.contiguous()
        nbytes = t.numel() * t.element_size()
        if self._pool is None or self._pool.nbytes < nbytes:
            self._pool = self.alloc((max(nbytes, 1 << 16),), torch.uint8, "input pool")
            self._pool_peers = self.register(self._pool)
            table = layout.peer_row(self._pool_peers)
            self.copy_in(self._pool_table, torch.tensor(table, dtype=torch.int64))
        self.copy_in(self._pool, t.view(-1).view(torch.uint8))
        return self._pool_table.addr

    def _launch(self, name: str, constexprs: dict, grid: int, args: dict,
                local: bool = False) -> None:
        kernel = self._ops[name].kernel
        if local:
            self.launch_local(kernel, constexprs, grid, args)
        else:
            args["call"] = self._call_id_for(name, constexprs, args)
            self.launch_ir(kernel, constexprs, grid, args)

    def _prepared_binder(self) -> Any:
        """How prepared calls (runtime/prepared.py) bind tensors and launch here."""
        from ..prepared_bind import SimBinder
        return SimBinder(self)

    def _write_signal(self, word: int, values: Any) -> None:
        with self.job.system.lock:
            self.device.write(self.signal.address + 4 * word, values)

    def close(self) -> None:
        """Free this rank's meta buffer and input pool (idempotent; every later call raises
        CommunicatorClosed before it launches, so no kernel touches the freed memory)."""
        if self._closed:
            return
        self._closed = True
        with self.job.system.lock:
            for buf in (self.meta, self._pool, self._pool_table):
                if buf is not None:
                    self.device.free(buf)
        self._pool = None

    def _fallback_all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """What torch.distributed would give: a sum of every rank's tensor (rank order here)."""
        xs = self.exchange(x.detach().clone())
        acc = xs[0].float()
        for other in xs[1:]:
            acc = acc + other.float()
        return acc.to(x.dtype)
