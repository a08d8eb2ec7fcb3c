"""Interleave the blocks of every rank of a launch, and decide when buffered stores land.

Each block is a generator (`interp.run`) that yields at global memory ops, fences, barriers
and loop back-edges; one scheduler step resumes one block up to its next yield. Policies:

  * "random" (seeded): each step picks a runnable block at random and runs it for a burst of
    1..B steps (B and the store delays are drawn per seed, from eager to very lazy), and every
    buffered store lands after an independent random delay, so stores of one block become
    visible out of program order unless a release orders them; plain loads may be served
    stale back to the block's last acquire (weak.py).
  * "round_robin": blocks in turn, one step each; a store lands one round later; loads are
    never stale (a deterministic, milder schedule: `peerdsl.sim.run(seed=None)`).
  * store_delay=N (either policy): a store lands within N steps (random) / after N steps
    (round robin); 0 makes memory sequentially consistent (to show what the weak model adds).
  * skew (with either): the blocks of rank r are not started before step skew[r].

Deadlock: when every live block is inside a `while` loop, no store is pending and memory has
not changed for `deadlock_steps` steps, nothing can ever change: `SimDeadlock` names each
block's last load (address, value) and its loop condition's operands. `max_steps` is a hard
cap (`SimHang`) so no launch can hang the caller.
"""
from __future__ import annotations

import heapq
import random
from typing import Any, Sequence

import numpy as np

from ..errors import SimDeadlock, SimError, SimHang
from .weak import Entry, WeakMemory

NS_PER_STEP = 10  # globaltimer: simulated nanoseconds per scheduler step


class BlockCtx:
    """The state of one simulated block: registers live in its generator's frame."""

    def __init__(self, mem: WeakMemory, sched: "Scheduler", rank: int, block: int,
                 kernel_name: str, smem: Any):
        self.mem = mem
        self.sched = sched
        self.rank = rank
        self.block = block
        self.kernel_name = kernel_name
        self.smem = smem
        self.pending: list[Entry] = []
        self.seq = 0
        self.spinning: list = []     # (while op, program) of the loops it is inside
        self.last_load: Any = None   # (op, addrs, values) of its latest global load
        self.last_op: Any = None     # the op it yielded at last
        self.gen: Any = None
        self.regs: list | None = None
        self.start = 0
        self.acq_time = 0            # step of its last acquire: plain loads read no older
        self.wave = getattr(smem, "wave", 32)  # lanes per wave of the device's target

    def clock(self) -> int:
        return self.sched.now * NS_PER_STEP

    def where(self) -> str:
        op = self.last_op
        loc = getattr(op, "loc", "") or "?"
        return f"rank {self.rank} block {self.block} of {self.kernel_name} at {loc}"


class Scheduler:
    def __init__(self, mem: WeakMemory, seed: int | None = None, policy: str | None = None,
                 skew: Sequence[int] | None = None, deadlock_steps: int = 500_000,
                 max_steps: int = 50_000_000, store_delay: int | None = None):
        self.mem = mem
        self.policy = policy or ("round_robin" if seed is None else "random")
        if self.policy not in ("random", "round_robin"):
            raise ValueError(f"unknown schedule policy {self.policy!r}")
        self.rng = random.Random(seed if seed is not None else 0)
        self.skew = list(skew or [])
        self.deadlock_steps = deadlock_steps
        self.max_steps = max_steps
        self.now = 0
        self._heap: list = []
        self._tick = 0
        if self.policy == "random":
            self.max_delay = self.rng.choice([0, 3, 20, 100, 500, 2000])
            self.max_burst = self.rng.choice([1, 1, 2, 8, 64])
        else:
            self.max_delay, self.max_burst = 0, 1
        self.store_delay = store_delay
        if store_delay is not None:
            self.max_delay = store_delay  # 0: every store lands at the next step (sequential)
        # stale plain loads only under the random policy with a weak store model
        self.stale_loads = self.policy == "random" and self.max_delay > 0

    def _stale_time(self, ctx: BlockCtx) -> int:
        """The moment a plain load of ctx reads memory at: not before its last acquire."""
        lo, now = ctx.acq_time, self.now
        if lo >= now:
            return now
        u = self.rng.random()
        if u < 0.4:
            return lo  # as old as the model allows
        if u < 0.6:
            return now
        return self.rng.randint(lo, now)

    def delay_of(self, rank: int) -> int:
        return self.skew[rank] if rank < len(self.skew) else 0

    def _on_buffer(self, ctx: BlockCtx, e: Entry) -> None:
        if self.policy == "random":
            due = self.now + self.rng.randint(0, self.max_delay)
        else:
            due = self.now + (self._nlive if self.store_delay is None else self.store_delay)
        self._tick += 1
        heapq.heappush(self._heap, (due, self._tick, ctx, e))

    def _flush_due(self) -> None:
        heap = self._heap
        while heap and heap[0][0] <= self.now:
            _, _, ctx, e = heapq.heappop(heap)
            self.mem.flush(ctx, e)

    def run(self, blocks: list[BlockCtx]) -> None:
        """Run every block to its end (and drain their stores), or raise."""
        mem = self.mem
        mem.on_buffer = self._on_buffer
        mem.clock = lambda: self.now
        mem.reset_launch(self._stale_time if self.stale_loads else None)
        waiting = sorted(blocks, key=lambda c: c.start)  # not started yet (skew)
        live: list[BlockCtx] = []
        self._nlive = len(blocks)
        last_writes, last_progress = mem.writes, 0
        rr = 0
        rng = self.rng
        try:
            with np.errstate(all="ignore"):
                while live or waiting:
                    while waiting and waiting[0].start <= self.now:
                        live.append(waiting.pop(0))
                    if not live:
                        self.now = waiting[0].start
                        continue
                    if self.policy == "random":
                        c = live[rng.randrange(len(live))]
                        burst = rng.randint(1, self.max_burst)
                    else:
                        rr = (rr + 1) % len(live)
                        c, burst = live[rr], 1
                    for _ in range(burst):
                        self._flush_due()
                        self.now += 1
                        try:
                            c.last_op = next(c.gen)
                        except StopIteration:
                            live.remove(c)
                            self._nlive = len(live) + len(waiting)
                            break
                        except SimError as e:
                            e.add_note(f"in {c.where()}")
                            raise
                    if mem.writes != last_writes:
                        last_writes, last_progress = mem.writes, self.now
                    elif self.now - last_progress > self.deadlock_steps and not self._heap \
                            and not waiting and all(b.spinning for b in live):
                        raise self._deadlock(live)
                    if self.now > self.max_steps:
                        raise SimHang(f"launch ran past {self.max_steps} scheduler steps; "
                                      "blocks still running:\n  " +
                                      "\n  ".join(b.where() for b in live))
            for b in blocks:
                mem.drain(b)  # the end of the kernel publishes everything
        finally:
            mem.on_buffer = lambda ctx, e: None
            mem.reset_launch(None)
            mem.device_pending.clear()
            self._heap.clear()

    def _deadlock(self, live: list[BlockCtx]) -> SimDeadlock:
        waiters, lines = [], []
        for b in live:
            info: dict[str, Any] = {"rank": b.rank, "block": b.block, "kernel": b.kernel_name}
            text = b.where()
            if b.last_load is not None:
                op, addrs, vals = b.last_load
                addr, val = int(addrs[0]), vals[0]
                info.update(address=addr, seen=val.tolist(), load_at=op.loc)
                text += f": polls {self.mem.describe(addr)} (load at {op.loc}), sees {val}"
            if b.spinning:
                wop, prog = b.spinning[-1]
                cond = _condition_operands(wop, prog, b.regs)
                if cond:
                    info["condition"] = cond
                    text += f"; loop condition {cond}"
            waiters.append(info)
            lines.append(text)
        return SimDeadlock(f"deadlock after {self.now} steps: every live block spins and "
                           "nothing changes memory any more:\n  " + "\n  ".join(lines), waiters)


def _condition_operands(wop: Any, prog: Any, regs: list | None) -> str:
    """The compares of a while loop's condition region with the first lane's values."""
    if regs is None:
        return ""
    parts = []
    for op in wop.regions[0].ops:
        if op.name == "cmp":
            vals = []
            for v in op.operands:
                r = regs[prog.slots[v.id]]
                vals.append(str(r[0]) if r is not None else "?")
            parts.append(f"{vals[0]} {op.attrs['pred']} {vals[1]}")
    return " and ".join(parts)
