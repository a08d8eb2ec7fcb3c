"""How a prepared call (runtime/prepared.py) binds its tensors and launches, per backend.

A binder turns the tensors of one prepared call into kernel argument values and each kernel
of its path into a launch closure (`go(tag)` for a collective kernel, `go()` for a local
one), and collects the per-call steps its backend needs: `before` (run ahead of the
launches) and `after` (run behind them), callables of no argument.

GPU (`GpuBinder`): every tensor is read and written in place; the registered input is the
bound tensor itself, shared with the peers once (`comm.register`, collective) and read
through its own peer-table row, or with `stage_input=True` copied into the registered pool
at each call, as plain eager calls do. Launches are `PreparedLaunch`es (packed once, one
driver call each); a loader without them (a test's fake, HIP) gets the trusted launch with
its argument dict.

Simulator (`SimBinder`): device memory is the simulator's, so each call copies the bound
CPU tensors in before the launches and the outputs back after them; launches go through
`launch_ir` / `launch_local` with the call tag set, as the communicator's `_launch` does.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import layout

Step = Callable[[], Any]


class GpuBinder:
    """Prepared calls on the GPU Communicator (runtime/communicator.py)."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.before: list[Step] = []
        self.after: list[Step] = []
        self.keep: list[Any] = []   # what the packed addresses point into

    def ready(self, x: torch.Tensor) -> None:
        """Raise if the call cannot be prepared here (checked with the inputs, before the
        ranks compare what they prepare: nothing after that may fail on one rank alone)."""
        if self.comm._capturing and self.comm._stream_capturing():
            raise RuntimeError("prepare a call outside torch.cuda.graph(): preparing shares "
                               "the bound input with the peers (collective)")
        if isinstance(x, torch.Tensor) and x.device != self.comm.device:
            raise ValueError(f"x is on {x.device}; this communicator runs on "
                             f"{self.comm.device}")

    def exchange(self, obj: Any) -> list:
        """Collective: every rank's `obj` (through the communicator's group)."""
        return self.comm._exchange(obj)

    def tensor(self, name: str, t: torch.Tensor) -> torch.Tensor:
        """An input read in place (checked contiguous by the entry's checks)."""
        if t.device != self.comm.device:
            raise ValueError(f"{name} is on {t.device}; this communicator runs on "
                             f"{self.comm.device}")
        self.keep.append(t)
        return t

    def registered(self, x: torch.Tensor, stage: bool) -> int:
        """The RegisteredPtrs input: the address of a table of every rank's copy of x."""
        comm = self.comm
        self.tensor("x", x)
        nbytes = x.numel() * x.element_size()
        if stage:
            if nbytes > comm.max_size:
                raise ValueError(f"{nbytes} bytes exceed the registered pool of "
                                 f"{comm.max_size} bytes (Communicator max_size)")
            dst = comm._pool[:nbytes].view(x.dtype).view(x.shape)
            self.before.append(lambda: dst.copy_(x))
            return comm.tables.base
        shared = comm.register(x)  # collective: every rank prepares the same calls in order
        self.keep.append(shared)
        return comm._registered_table(shared)

    def output(self, given: torch.Tensor | None, shape: tuple, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """(kernel value, result tensor) of an output: `given`, or allocated once here."""
        t = given if given is not None else self.comm._new(shape, dtype)
        if given is not None:
            self.tensor("output", given)
        self.keep.append(t)
        return t, t

    def scratch(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        t = self.comm._new(shape, dtype)
        self.keep.append(t)
        return t

    def launch(self, name: str, constexprs: dict, grid: int, args: dict,
               local: bool = False) -> Callable[..., None]:
        kernel, trusted, cap, call_params = self.comm._kernel_hit(name, constexprs, local)
        words = () if local else call_params
        if not local:
            grid = min(grid, cap)
        prepare = getattr(kernel, "prepare", None)
        if prepare is None:  # no prepared launches here: the trusted launch, its dict reused
            values = {**args, **{p: 0 for p in words}}
            if local:
                return lambda: trusted(grid, values)

            def go(tag: int) -> None:
                for p in words:
                    values[p] = tag
                trusted(grid, values)
            return go
        prepared = prepare(grid, {**args, **{p: 0 for p in words}})
        self.keep.append(prepared)
        return prepared.launcher(words)

    def check(self, name: str) -> Step | None:
        """What the eager call does after a collective launch with check_errors=True: read
        the error word (a sync) and raise the recorded error."""
        comm = self.comm
        if not comm.check_each_call:
            return None

        def check_error_word() -> None:
            if comm._capturing and comm._stream_capturing():
                return
            if comm._error_flag.item():
                comm.check_errors(name)
        return check_error_word


class SimBinder:
    """Prepared calls on the simulator's communicator (runtime/sim/collective_comm.py)."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.before: list[Step] = []
        self.after: list[Step] = []
        self.keep: list[Any] = []

    def ready(self, x: torch.Tensor) -> None:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            raise ValueError(f"x is on {x.device}: on the simulator pass CPU tensors")

    def exchange(self, obj: Any) -> list:
        return self.comm.exchange(obj)

    def tensor(self, name: str, t: torch.Tensor) -> Any:
        comm = self.comm
        if t.device.type != "cpu":
            raise ValueError(f"{name} is on {t.device}: on the simulator pass CPU tensors")
        buf = comm.alloc(tuple(t.shape), t.dtype, f"prepared {name}")
        self.before.append(lambda: comm.copy_in(buf, t))
        self.keep.append(t)
        return buf

    def registered(self, x: torch.Tensor, stage: bool) -> int:
        comm = self.comm
        if stage:
            address = comm._stage(x)  # the pool grows here if it must (collective)
            self.before.append(lambda: comm._stage(x))
            self.keep.append(x)
            return address
        buf = self.tensor("x", x)
        peers = comm.register(buf)  # collective: every rank's address of its copy
        table = comm.alloc((layout.MAX_RANKS,), torch.int64, "prepared input table")
        comm.copy_in(table, torch.tensor(layout.peer_row(peers), dtype=torch.int64))
        return table.addr

    def output(self, given: torch.Tensor | None, shape: tuple, dtype: torch.dtype
               ) -> tuple[Any, torch.Tensor]:
        comm = self.comm
        buf = comm.alloc(shape, dtype, "prepared output")
        t = given if given is not None else torch.empty(shape, dtype=dtype)
        self.after.append(lambda: t.copy_(comm.to_torch(buf, shape, dtype)))
        return buf, t

    def scratch(self, shape: tuple, dtype: torch.dtype) -> Any:
        return self.comm.alloc(shape, dtype, "prepared scratch")

    def launch(self, name: str, constexprs: dict, grid: int, args: dict,
               local: bool = False) -> Callable[..., None]:
        comm = self.comm
        kernel = comm._ops[name].kernel
        if local:
            return lambda: comm.launch_local(kernel, constexprs, grid, args)

        def go(tag: int) -> None:
            comm.launch_ir(kernel, constexprs, grid, {**args, "call": tag})
        return go

    def check(self, name: str) -> Step | None:
        return None  # every simulated launch reads its error record already
