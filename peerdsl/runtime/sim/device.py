"""Simulated devices: global memory, torch interop, and kernel launches under the scheduler.

    system = SimSystem(world=4, target="gfx1250")
    dev = system.devices[0]
    buf = dev.to_device(torch.randn(64, 6144, dtype=torch.bfloat16))   # DeviceBuffer
    dev.launch(kernel_ir, grid=8, args={"x": buf, "n": 123})           # one rank alone
    system.launch_many([Launch(dev, kernel_ir, 8, args), ...], seed=3)  # ranks together
    out = dev.to_torch(buf)                                             # back to torch

Pointer arguments are device addresses (ints) or DeviceBuffers; a `PeerPtrs` parameter `x`
takes a list of up to 8 addresses under the name "x" (or x_0.. x_7 one by one); missing
entries are null.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any, Sequence

import numpy as np
import torch

from ...dsl import ir
from ..errors import SimError
from . import numerics as nx
from .interp import Program, run
from .memory import Allocation
from .shared import SharedMemory
from .scheduler import BlockCtx, Scheduler
from .weak import WeakMemory


@dataclasses.dataclass(frozen=True)
class SimTarget:
    name: str
    wave_size: int
    fp8_format: str


TARGETS = {"gfx1250": SimTarget("gfx1250", 32, "e4m3fn"),
           "gfx950": SimTarget("gfx950", 64, "e4m3fn"),
           "gfx942": SimTarget("gfx942", 64, "e4m3fnuz"),
           "sm_90": SimTarget("sm_90", 32, "e4m3fn")}


class DeviceBuffer:
    """An allocation on a simulated device; `int(buf)` / `buf.addr` is its address."""

    def __init__(self, device: "SimDevice", alloc: Allocation, shape: tuple = (),
                 dtype: torch.dtype | None = None):
        self.device = device
        self.alloc = alloc
        self.shape = tuple(shape)
        self.dtype = dtype

    @property
    def addr(self) -> int:
        return self.alloc.addr

    @property
    def nbytes(self) -> int:
        return self.alloc.nbytes

    def __int__(self) -> int:
        return self.addr

    __index__ = __int__

    def __repr__(self) -> str:
        return (f"DeviceBuffer(rank {self.device.index}, {self.alloc.name}, {self.addr:#x}, "
                f"{self.nbytes} B, shape={self.shape}, dtype={self.dtype})")


def program_of(kernel: ir.Kernel) -> Program:
    """The compiled form of a kernel, built once and cached on the IR object."""
    prog = getattr(kernel, "_sim_program", None)
    if prog is None:
        prog = Program(kernel)
        kernel._sim_program = prog  # type: ignore[attr-defined]
    return prog


@dataclasses.dataclass
class Launch:
    device: "SimDevice"
    kernel: ir.Kernel
    grid: int | Sequence[int]
    args: dict[str, Any]
    delay: int = 0  # scheduler steps before this launch's blocks start


class SimDevice:
    def __init__(self, system: "SimSystem", index: int, target: str = "gfx1250"):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}; one of {sorted(TARGETS)}")
        self.system = system
        self.index = index
        self.target = TARGETS[target]

    @property
    def wave_size(self) -> int:
        return self.target.wave_size

    @property
    def fp8_format(self) -> str:
        return self.target.fp8_format

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int, name: str = "", shape: tuple = (),
              dtype: torch.dtype | None = None) -> DeviceBuffer:
        """Zero-filled device memory."""
        return DeviceBuffer(self, self.system.mem.allocate(self.index, int(nbytes), name),
                            shape, dtype)

    def alloc_tensor(self, shape: Sequence[int], dtype: torch.dtype, name: str = "") -> DeviceBuffer:
        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        return self.alloc(n, name, tuple(shape), dtype)

    def free(self, buf: DeviceBuffer) -> None:
        self.system.mem.free(buf.alloc)

    def write(self, addr: int | DeviceBuffer, data: torch.Tensor | np.ndarray | bytes) -> None:
        """Host -> device copy (between launches: memory is then fully drained)."""
        if isinstance(data, torch.Tensor):
            raw = data.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        else:
            raw = np.frombuffer(bytes(data) if isinstance(data, (bytes, bytearray))
                                else np.ascontiguousarray(data).tobytes(), np.uint8)
        a, off = self.system.mem.resolve(int(addr))
        if off + raw.size > a.nbytes:
            raise SimError(f"write of {raw.size} B at {a.name}+{off:#x} past its end")
        a.buf[off:off + raw.size] = raw

    def read(self, addr: int | DeviceBuffer, nbytes: int) -> np.ndarray:
        a, off = self.system.mem.resolve(int(addr))
        if off + nbytes > a.nbytes:
            raise SimError(f"read of {nbytes} B at {a.name}+{off:#x} past its end")
        return a.buf[off:off + nbytes].copy()

    def to_device(self, t: torch.Tensor, name: str = "") -> DeviceBuffer:
        buf = self.alloc_tensor(tuple(t.shape), t.dtype, name)
        self.write(buf, t)
        return buf

    def to_torch(self, addr: int | DeviceBuffer, shape: Sequence[int] | None = None,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
        if isinstance(addr, DeviceBuffer):
            shape = addr.shape if shape is None else shape
            dtype = addr.dtype if dtype is None else dtype
        if shape is None or dtype is None:
            raise ValueError("to_torch needs shape and dtype for a raw address")
        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        return torch.from_numpy(self.read(addr, n)).view(dtype).reshape(tuple(shape))

    # ------------------------------------------------------------------ launch
    def launch(self, kernel: ir.Kernel, grid: int | Sequence[int], args: dict[str, Any],
               **sched: Any) -> None:
        """Run one kernel on this device alone (blocks interleaved by the scheduler)."""
        self.system.launch_many([Launch(self, kernel, grid, args)], **sched)


class SimSystem:
    """The devices of one simulated node, sharing one address space."""

    def __init__(self, world: int, target: str = "gfx1250"):
        self.mem = WeakMemory()
        self.devices = [SimDevice(self, r, target) for r in range(world)]
        self.lock = threading.RLock()  # one launch or host copy at a time: deterministic

    def launch_many(self, launches: Sequence[Launch], seed: int | None = None,
                    policy: str | None = None, skew: Sequence[int] | None = None,
                    deadlock_steps: int = 500_000, max_steps: int = 50_000_000,
                    store_delay: int | None = None) -> None:
        """Run the launches together (one per rank) under one scheduler."""
        with self.lock:  # one launch at a time: the interleaving is the scheduler's alone
            delays = [0] * len(self.devices)
            for ln in launches:
                base = skew[ln.device.index] if skew and ln.device.index < len(skew) else 0
                delays[ln.device.index] = base + ln.delay
            sched = Scheduler(self.mem, seed, policy, delays, deadlock_steps, max_steps,
                              store_delay)
            blocks = []
            for ln in launches:
                blocks.extend(self._blocks(ln, sched, delays[ln.device.index]))
            sched.run(blocks)

    def _blocks(self, ln: Launch, sched: Scheduler, start: int) -> list[BlockCtx]:
        prog = program_of(ln.kernel)
        grid = ln.grid if isinstance(ln.grid, int) else int(np.prod(ln.grid))
        if grid < 1:
            raise SimError(f"grid {ln.grid!r} launches no block")
        lanes = prog.lanes
        regs = list(prog.template)
        for name, slot, t in prog.params:
            regs[slot] = _arg_register(ln.args, name, t, lanes, prog.name)
        out = []
        tid = np.arange(lanes, dtype=np.int32)
        gdim = np.full(lanes, grid, np.int32)
        for b in range(grid):
            smem = SharedMemory(prog.shared_bytes, ln.device.wave_size, prog.smem_names)
            ctx = BlockCtx(self.mem, sched, ln.device.index, b, prog.name, smem)
            r = list(regs)
            bid = np.full(lanes, b, np.int32)
            for slot, which in prog.specials:
                r[slot] = tid if which == "thread_id" else bid if which == "block_id" else gdim
            for slot, off in prog.smem:
                r[slot] = np.full(lanes, off, np.int64)
            ctx.regs = r
            ctx.gen = run(prog.body, r, None, ctx)
            ctx.start = start
            out.append(ctx)
        return out


def _arg_register(args: dict[str, Any], name: str, t: Any, lanes: int, kname: str) -> np.ndarray:
    if name in args:
        v = args[name]
    else:
        base, _, idx = name.rpartition("_")
        if base in args and idx.isdigit():
            table = list(args[base])
            v = table[int(idx)] if int(idx) < len(table) else 0
        else:
            raise SimError(f"kernel {kname}: no argument for parameter {name!r} "
                           f"(given: {sorted(args)})")
    if isinstance(t, ir.PtrType):
        return np.full(lanes, int(v), np.int64)
    return nx.const_array(float(v) if t.is_float else int(v), t, lanes)
