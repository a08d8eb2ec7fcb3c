"""SimCommunicator: one rank's view of a simulated multi-GPU job (what ops/ builds on).

`peerdsl.sim.run(tp, fn)` starts one Python thread per rank running `fn(comm)`. Host code of
each rank is ordinary Python; every *collective* call (`launch_ir`, `register`, `exchange`,
`barrier`, and `launch` of a kernel that synchronizes) is a rendezvous: the last rank to arrive executes the call for all ranks (kernel
launches of all ranks together under one scheduler), then every rank continues with its own
result or error. All ranks must make the same sequence of collective calls.
Collective ops (all_reduce, fused_allreduce_rmsnorm, ...) are added on top of this API by
subclassing SimCommunicator and passing `comm_cls=` to `peerdsl.sim.run` / `SimJob`
(`peerdsl.sim.run` defaults to collective_comm.SimCollectiveComm).

API of `SimCommunicator` (attributes, then methods):
    rank, world: int
    device: SimDevice                  this rank's device (target, wave_size, fp8_format)
    target: str; fp8_format: str       e.g. "gfx1250", "e4m3fn"
    meta: DeviceBuffer                 this rank's meta buffer, laid out per layout.MetaLayout:
                                       Signal at offset 0 (zeroed, spin-limit word set)
    meta_layout: layout.MetaLayout
    peer_meta: list[int]               every rank's meta buffer address (index = rank)
    peer_signals: list[int]            every rank's Signal address (meta + 0)
    signal: PeerBuffer                 the same as a PeerPtrs value for comm.launch
    ll_offset, staging_offset: int     byte offsets of the LL scratch and staging in meta
    alloc(shape, dtype, name="") -> DeviceBuffer          zeroed device tensor
    to_device(tensor, name="") -> DeviceBuffer            new device copy of a CPU tensor
    copy_in(buf, tensor) / to_torch(buf_or_addr, shape=None, dtype=None) -> torch.Tensor
    register(buf) -> list[int]         collective: every rank's address of its `buf`
                                       (a DeviceBuffer or address; a CPU tensor gives a
                                       PeerBuffer, see comm.launch)
    peer_buffer(shape, dtype) -> PeerBuffer   collective: zeroed peer-visible memory
    exchange(obj) -> list              collective all-gather of a host object
    barrier() -> None                  collective host barrier
    launch(op_or_kernel, grid=..., constexprs=None, **args) -> None
        the user launch, the same call as on the GPU Communicator, with torch CPU tensors
        (sim/user_launch.py): args checked against the kernel's signature, results copied
        back into the tensors passed
    launch_ir(kernel, constexprs, grid, args, delay=None) -> None
        the primitive collective launch: every rank launches (normally the same kernel) and all ranks'
        blocks run together. `kernel` is a dsl Kernel (traced with `constexprs`) or an
        ir.Kernel. `args`: name -> int / float / address / DeviceBuffer, or a list of
        addresses for a PeerPtrs parameter. `delay`: this rank starts that many scheduler
        steps late (on top of the job's skew); None uses `comm.delay`. After the launch
        each rank reads its Signal error record and raises its CollectiveError
        (`CollectiveTimeout`, `CollectiveMismatch`, `CollectiveAborted`) if a wait failed.
        Simulator errors (SimDeadlock, SimHang, SimMemoryFault, SimRace, ...) are raised on
        every rank; a rank whose peers do not make the same call within the job's
        `rendezvous_timeout_s` raises SimRendezvousTimeout.
    launch_local(kernel, constexprs, grid, args, seed=None) -> None
        this rank alone, no rendezvous (scheduled like the job's launches unless seeded)
    delay: int                         default start delay (scheduler steps) of this rank's
                                       next collective launches (settable between launches:
                                       e.g. a different skew per rank and step)
    set_spin_limit(n) -> None          the Signal's spin-limit word of this rank
    check_errors(kernel_name="") -> None
"""
from __future__ import annotations

import threading
import time
from typing import Any, Sequence

import numpy as np
import torch

from ... import layout
from ...dsl import ir
from ...dsl.kernel import Kernel as DslKernel
from ..errors import (CollectiveError, SimAborted, SimCallMismatch, SimPeerGone,
                      SimRendezvousTimeout, error_from_record)
from .device import DeviceBuffer, Launch, SimSystem
from .user_launch import SimUserLaunch

_SIG_ERR_BYTE = layout.SIG_ERROR * 4
_SPIN_BYTE = layout.SIG_SPIN_LIMIT * 4


_TRACE_LOCK = threading.Lock()  # DSL tracing uses one global trace state: not thread-safe


def _ir_of(kernel: Any, constexprs: dict | None) -> ir.Kernel:
    if isinstance(kernel, ir.Kernel):
        return kernel
    if isinstance(kernel, DslKernel):
        with _TRACE_LOCK:
            return kernel.trace(**(constexprs or {}))
    raise TypeError(f"launch needs a dsl kernel or an ir.Kernel, got {kernel!r}")


def describe_meta(off: int) -> str:
    """Name a byte offset of a meta buffer (layout.py) for error messages."""
    if off >= layout.SIGNAL_BYTES:
        return ""
    w = off // 4
    if w < layout.SIG_EPOCH:
        slot, half = divmod(w - layout.SIG_SLOTS, layout.SLOT_WORDS)
        return (f"Signal slot [block {slot // layout.MAX_RANKS}][peer "
                f"{slot % layout.MAX_RANKS}] {('epoch', 'tag')[half]}")
    if w < layout.SIG_LL_EPOCH:
        return f"Signal epoch of block {w - layout.SIG_EPOCH}"
    if w < layout.SIG_SPIN_LIMIT:
        return f"Signal LL epoch (copy of block {w - layout.SIG_LL_EPOCH})"
    if w == layout.SIG_SPIN_LIMIT:
        return "Signal spin limit"
    if layout.SIG_ERROR <= w < layout.SIG_ERROR + layout.ERROR_WORDS:
        return f"Signal error word {w - layout.SIG_ERROR}"
    return "Signal"


class SimJob:
    """The ranks of one `peerdsl.sim.run`: devices, communicators and the rendezvous."""

    def __init__(self, world: int, target: str = "gfx1250", seed: int | None = None,
                 skew: Any = None, policy: str | None = None, spin_limit: int = 10_000,
                 ll_max_bytes: int = layout.LL_MAX_BYTES,
                 staging_bytes: int = layout.STAGING_BYTES,
                 deadlock_steps: int = 500_000, max_steps: int = 50_000_000,
                 store_delay: int | None = None, comm_cls: type | None = None,
                 rendezvous_timeout_s: float = 120.0):
        if not 1 <= world <= layout.MAX_RANKS:
            raise ValueError(f"world {world} not in [1, {layout.MAX_RANKS}]")
        check_job = getattr(comm_cls, "check_job", None)
        if check_job is not None:  # the collective communicator: an unbuilt world fails here
            check_job(world, target)
        self.world = world
        self.system = SimSystem(world, target)
        self.seed, self.skew, self.policy = seed, skew, policy
        self.deadlock_steps, self.max_steps = deadlock_steps, max_steps
        self.sched_options = dict(deadlock_steps=deadlock_steps, max_steps=max_steps,
                                  store_delay=store_delay)
        self.launches = 0
        # how long a rank waits for its peers to make the same collective call (a launch runs
        # holding the condition, so the time it takes once everyone arrived does not count)
        self.rendezvous_timeout_s = rendezvous_timeout_s
        self._cond = threading.Condition()
        self._slots: dict[int, tuple[str, Any]] = {}
        self._gen = 0
        self._results: dict[int, Any] = {}
        self.failed: BaseException | None = None
        self.exited: set[int] = set()
        ml = layout.MetaLayout(world, ll_max_bytes, staging_bytes)
        cls = comm_cls or SimCommunicator
        self.comms = [cls(self, r, ml, spin_limit) for r in range(world)]
        self.system.mem.describers["meta"] = describe_meta
        peers = [c.meta.addr for c in self.comms]
        for c in self.comms:
            c.peer_meta = list(peers)

    # ------------------------------------------------------------------ rendezvous
    def collective(self, rank: int, kind: str, item: Any) -> Any:
        with self._cond:
            if self.failed is not None:
                raise SimAborted(f"rank {rank}: another rank failed: {self.failed!r}")
            gen = self._gen
            self._slots[rank] = (kind, item)
            if len(self._slots) == self.world:
                slots, self._slots = self._slots, {}
                try:
                    res: Any = self._execute(slots)
                except BaseException as e:  # every rank gets the error
                    res = e
                self._results[gen] = res
                self._gen += 1
                self._results.pop(gen - 2, None)
                self._cond.notify_all()
            else:
                self._wait_for_peers(rank, kind, gen)
            res = self._results[gen]
        if isinstance(res, BaseException):
            raise res
        return res[rank]

    def _wait_for_peers(self, rank: int, kind: str, gen: int) -> None:
        """Wait (holding the condition) until the call of generation `gen` ran, or raise: a
        peer failed, returned, or did not arrive within the rendezvous timeout."""
        deadline = time.monotonic() + self.rendezvous_timeout_s
        while self._gen == gen and self.failed is None and not self.exited:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._cond.wait(min(0.5, left))
        if self._gen != gen:
            return
        missing = sorted(set(range(self.world)) - set(self._slots))
        self._slots.pop(rank, None)
        if self.failed is not None:
            raise SimAborted(f"rank {rank}: another rank failed: {self.failed!r}")
        if self.exited:
            raise SimPeerGone(f"rank {rank} waits in a collective {kind} that ranks "
                           f"{sorted(self.exited)} never made (they returned)")
        raise SimRendezvousTimeout(
            f"rank {rank} waited {self.rendezvous_timeout_s:g} s in a collective {kind} that "
            f"ranks {missing} did not make (stuck, dead, or making other calls)")

    def exit(self, rank: int) -> None:
        with self._cond:
            self.exited.add(rank)
            self._cond.notify_all()

    def fail(self, e: BaseException) -> None:
        with self._cond:
            if self.failed is None:
                self.failed = e
            self._cond.notify_all()

    def _execute(self, slots: dict[int, tuple[str, Any]]) -> list:
        kinds = {k for k, _ in slots.values()}
        if len(kinds) != 1:
            raise SimCallMismatch("ranks made different collective calls at the same point: " +
                           ", ".join(f"rank {r}: {slots[r][0]}" for r in sorted(slots)))
        kind = kinds.pop()
        items = [slots[r][1] for r in range(self.world)]
        if kind == "exchange":
            return [list(items)] * self.world
        # launch: one per rank, all together
        idx = self.launches
        self.launches += 1
        skew = self.skew(idx) if callable(self.skew) else self.skew
        if isinstance(skew, int):
            skew = [r * skew for r in range(self.world)]
        seed = None if self.seed is None else (self.seed * 1_000_003 + idx) & 0x7FFFFFFF
        self.system.launch_many(items, seed=seed, policy=self.policy, skew=skew,
                                **self.sched_options)
        out: list[Any] = []
        for r, ln in enumerate(items):
            try:
                self.comms[r].check_errors(ln.kernel.name)
                out.append(None)
            except CollectiveError as e:
                out.append(e)
        return out


class SimCommunicator(SimUserLaunch):
    """One rank of a simulated job; see the module docstring for the API."""

    def __init__(self, job: SimJob, rank: int, meta_layout: layout.MetaLayout,
                 spin_limit: int):
        self.job = job
        self.rank = rank
        self.world = job.world
        self.device = job.system.devices[rank]
        self.target = self.device.target.name
        self.fp8_format = self.device.fp8_format
        self.meta_layout = meta_layout
        self.meta = self.device.alloc(meta_layout.total_bytes, "meta")
        self.ll_offset = meta_layout.ll_offset
        self.staging_offset = meta_layout.staging_offset
        self.peer_meta: list[int] = []
        self.delay = 0
        self._local_launches = 0
        self.set_spin_limit(spin_limit)

    @property
    def peer_signals(self) -> list[int]:
        return [a + self.meta_layout.signal_offset for a in self.peer_meta]

    def __repr__(self) -> str:
        return f"SimCommunicator(rank {self.rank}/{self.world}, {self.target})"

    # ------------------------------------------------------------------ memory
    def alloc(self, shape: Sequence[int], dtype: torch.dtype, name: str = "") -> DeviceBuffer:
        with self.job.system.lock:
            return self.device.alloc_tensor(tuple(shape), dtype, name)

    def to_device(self, t: torch.Tensor, name: str = "") -> DeviceBuffer:
        with self.job.system.lock:
            return self.device.to_device(t, name)

    def copy_in(self, buf: DeviceBuffer | int, t: torch.Tensor) -> None:
        with self.job.system.lock:
            self.device.write(buf, t)

    def to_torch(self, buf: DeviceBuffer | int, shape: Sequence[int] | None = None,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
        with self.job.system.lock:
            return self.device.to_torch(buf, shape, dtype)

    def set_spin_limit(self, n: int) -> None:
        self.device.write(self.meta.addr + _SPIN_BYTE, np.array([n], np.int32))

    # ------------------------------------------------------------------ collectives
    def exchange(self, obj: Any) -> list:
        return self.job.collective(self.rank, "exchange", obj)

    def register(self, buf: DeviceBuffer | int | torch.Tensor) -> Any:
        """Collective: every rank's address of its `buf` (a list), or for a CPU tensor a
        PeerBuffer whose tensor stays in step with the device (see `launch`)."""
        if isinstance(buf, torch.Tensor):
            return self._register_tensor(buf)
        return [int(a) for a in self.exchange(int(buf))]

    def barrier(self) -> None:
        self.exchange(None)

    def launch_ir(self, kernel: Any, constexprs: dict | None, grid: int | Sequence[int],
                  args: dict[str, Any], delay: int | None = None) -> None:
        d = self.delay if delay is None else delay
        ln = Launch(self.device, _ir_of(kernel, constexprs), grid, dict(args), int(d))
        err = self.job.collective(self.rank, "launch", ln)
        if err is not None:
            raise err

    def launch_local(self, kernel: Any, constexprs: dict | None, grid: int | Sequence[int],
                     args: dict[str, Any], seed: int | None = None) -> None:
        k = _ir_of(kernel, constexprs)
        self._local_launches += 1
        if seed is None and self.job.seed is not None:  # adversarial like the collectives
            seed = (self.job.seed * 1_000_003 + 7919 * (self.rank + 1) * self._local_launches
                    ) & 0x7FFFFFFF
        self.job.system.launch_many([Launch(self.device, k, grid, dict(args), self.delay)],
                                    seed=seed, policy=self.job.policy,
                                    **self.job.sched_options)
        self.check_errors(k.name)

    def check_errors(self, kernel_name: str = "") -> None:
        """Raise the CollectiveError (timeout, mismatch, abort) of this rank's error record
        if a wait of its kernels wrote one. This primitive clears the record, so raw launches
        can go on; the collectives refuse every call after an error (runtime/callid.py)."""
        rec = self.device.read(self.meta.addr + _SIG_ERR_BYTE, 4 * layout.ERROR_WORDS)
        words = rec.view(np.int32)
        if words[0] != 0:
            self.device.write(self.meta.addr + _SIG_ERR_BYTE,
                              np.zeros(layout.ERROR_WORDS, np.int32))
            record = getattr(self, "_record_error", None)
            if record is not None:  # the collectives: named tags, and broken from now on
                raise record(words, kernel_name)
            raise error_from_record(words, kernel_name, self.rank)
