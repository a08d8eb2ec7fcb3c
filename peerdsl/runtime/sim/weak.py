"""The memory model: weak enough that missing releases, acquires and barriers show up.

Stores (a plain or relaxed store of a scalar or a 16-byte pack is one `Entry`) go through
three levels, like a GPU's write path:
  BLOCK   the writing block's store buffer: seen by that block only;
  DEVICE  the device level (its L2): seen by every block of the writer's device, not by
          other ranks, whatever memory the store targets;
  MEMORY  seen by everyone.
An entry moves on when the scheduler's random (or round-robin) delay for it expires, in any
order (a later relaxed flag may land before earlier data), or when the block orders it.
A release orders the stores of the releasing wave(s) and, through a block barrier, the
stores every wave made before that barrier (so a flag raised by thread 0 without a barrier
after the other waves' data stores does not publish their data):
  * release (store, atomic, fence) at agent scope: those entries move to DEVICE, and an
    agent-release store itself lands at DEVICE;
  * release at system scope: the device level of the block's device (L2 write-back) and then
    those entries go to MEMORY; the release store itself goes to MEMORY;
  * workgroup/wave scope and block barriers order nothing beyond the block (the block runs in
    lockstep, so they need nothing inside it); the end of a launch publishes everything.
Same-location order (coherence) is kept: an entry lands after the earlier entries of its
block, and of its device level, that overlap it.

Loads: a block sees MEMORY, then its device's DEVICE entries, then its own BLOCK entries. A
plain (unscoped) load may moreover be served stale: it sees memory as it was at a moment the
scheduler picks between the block's last acquire (acquire load / atomic / fence at agent or
system scope, or the launch start) and now, except for the block's own writes. So data read
without an acquire after the flag that published it may be old (non-coherent L0/L1 caches,
reordered loads). Scoped loads (atomics, volatile LL lines) read the latest value. Atomics
act on MEMORY directly, after the overlapping pending entries of every level landed.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable

import numpy as np

from ..errors import SimMemoryFault
from .memory import Allocation, GlobalMemory, apply_atomic, bytes_of

BLOCK, DEVICE, MEMORY = 0, 1, 2
_PAGE_SHIFT = 12  # the write log is indexed by 4 KiB pages


class Entry:
    """One store of one block: the bytes of its active lanes into one allocation."""
    __slots__ = ("alloc", "starts", "data", "lo", "hi", "state", "ctx", "dev", "vtime",
                 "waves", "fenced")

    def __init__(self, alloc: Allocation, starts: np.ndarray, data: np.ndarray, ctx: Any,
                 waves: np.ndarray | None = None):
        self.alloc = alloc
        self.starts = starts          # int64 byte offsets, one per lane
        self.data = data              # uint8 [lanes, nbytes]
        self.lo = int(starts.min())
        self.hi = int(starts.max()) + data.shape[1]
        self.state = BLOCK
        self.ctx = ctx
        self.dev = ctx.rank           # whose device level it passes through
        self.vtime: int | None = None  # when it reached DEVICE (for the write log)
        self.waves = waves            # the wave of each lane (None: any release orders it)
        self.fenced = False           # a block barrier came after it: any wave's release
                                      # publishes it (cumulativity through the barrier)

    def overlaps(self, a: Allocation, lo: int, hi: int) -> bool:
        return self.alloc is a and self.lo < hi and lo < self.hi


class Record:
    """One write that reached MEMORY: by which block, the bytes before and after."""
    __slots__ = ("ctx", "starts", "old", "new", "lo", "hi", "seq")

    def __init__(self, ctx: Any, starts: np.ndarray, old: np.ndarray, new: np.ndarray,
                 seq: int):
        self.ctx, self.starts, self.old, self.new, self.seq = ctx, starts, old, new, seq
        self.lo = int(starts.min())
        self.hi = int(starts.max()) + old.shape[1]


class WeakMemory(GlobalMemory):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0  # bumped whenever a store moves on (progress, for the deadlock check)
        self.device_pending: dict[int, list[Entry]] = {}
        # set by the scheduler during a launch: where new entries are queued, the clock, and
        # the moment a plain load of a block reads memory at (None: never stale)
        self.on_buffer: Callable[[Any, Entry], None] = lambda ctx, e: None
        self.clock: Callable[[], int] = lambda: 0
        self.stale_time: Callable[[Any], int] | None = None
        # (allocation key, page) -> (times, records) of the writes that touched the page
        self.history: dict[tuple[int, int], tuple[list[int], list[Record]]] = {}
        self._logged: set[int] = set()
        self._seq = 0
        self._flushes = 0

    def reset_launch(self, stale_time: Callable[[Any], int] | None) -> None:
        self.stale_time = stale_time
        self.history.clear()
        self._logged.clear()

    # ------------------------------------------------------------------ loads
    def load(self, ctx: Any, addrs: np.ndarray, dt: np.dtype, count: int,
             plain: bool = False) -> np.ndarray:
        size = dt.itemsize * max(count, 1)
        out = None
        for a, sel, offs in self._groups(addrs, size, "load"):
            vals = self._read(a, offs, dt, count)
            lo, hi = int(offs.min()), int(offs.max()) + size
            if plain and self.stale_time is not None and a.key in self._logged:
                vals = self._stale(ctx, a, offs, vals, lo, hi, size)
            for level in (self.device_pending.get(ctx.rank), ctx.pending):
                for e in level or ():
                    if e.state != MEMORY and e.overlaps(a, lo, hi):
                        vals = np.ascontiguousarray(vals)
                        raw = vals.view(np.uint8).reshape(len(offs), size)
                        self._overlay(e.starts, e.data, offs, raw)
            if sel is None:
                return vals
            if out is None:
                out = np.zeros((len(addrs),) if count == 0 else (len(addrs), count), dt)
            out[sel] = vals
        return out

    def _stale(self, ctx, a, offs, vals, lo, hi, size):
        """Undo other blocks' writes that reached memory after the moment this load reads."""
        t = -1
        found: dict[int, Record] = {}
        for page in range(lo >> _PAGE_SHIFT, ((hi - 1) >> _PAGE_SHIFT) + 1):
            bucket = self.history.get((a.key, page))
            if bucket is None:
                continue
            if t < 0:
                t = self.stale_time(ctx)
            times, recs = bucket
            for r in recs[bisect_right(times, t):]:
                if r.lo < hi and lo < r.hi:
                    found[r.seq] = r
        if not found:
            return vals
        hits = [found[k] for k in sorted(found)]
        vals = np.ascontiguousarray(vals)
        raw = vals.view(np.uint8).reshape(len(offs), size)
        for r in reversed(hits):
            if r.ctx is not ctx:
                self._overlay(r.starts, r.old, offs, raw)
        for r in hits:  # a block always sees its own writes
            if r.ctx is ctx:
                self._overlay(r.starts, r.new, offs, raw)
        return vals

    # ------------------------------------------------------------------ stores
    def store(self, ctx: Any, addrs: np.ndarray, vals: np.ndarray, level: int,
              waves: np.ndarray | None = None) -> None:
        """A store landing at `level` (BLOCK: buffered; DEVICE: agent release; MEMORY).
        `waves`: the wave of each active lane (a release by some waves splits the entry)."""
        data = bytes_of(vals, len(addrs))
        for a, sel, offs in self._groups(addrs, data.shape[1], "store"):
            d = data if sel is None else data[sel]
            if level == MEMORY:
                self._land_overlapping(ctx, a, int(offs.min()), int(offs.max()) + d.shape[1])
                self._write_logged(ctx, a, offs, d, None)
                self.writes += 1
                continue
            w = None if waves is None or level != BLOCK else (waves if sel is None else waves[sel])
            e = Entry(a, offs, d, ctx, w)
            if level == BLOCK:
                ctx.pending.append(e)
            else:
                self._to_device(e)
            self.on_buffer(ctx, e)

    def block_barrier(self, ctx: Any) -> None:
        """A block barrier: what any wave stored before it, a later release of any wave
        publishes."""
        for p in ctx.pending:
            p.fenced = True

    def _to_device(self, e: Entry) -> None:
        e.state = DEVICE
        e.vtime = self.clock()
        self.device_pending.setdefault(e.dev, []).append(e)
        self.writes += 1

    def _commit(self, e: Entry) -> None:
        self._write_logged(e.ctx, e.alloc, e.starts, e.data, e.vtime)
        e.state = MEMORY
        self.writes += 1

    def _write_logged(self, ctx: Any, a: Allocation, offs: np.ndarray, new: np.ndarray,
                      when: int | None) -> None:
        """Write `new` [k, n] at offs; log the old bytes for stale loads. `when`: the time
        it became visible at the device level, if earlier than now (stale loads never go
        back past that: the model only ever errs on the strong side)."""
        if self.stale_time is not None:
            old = self._read(a, offs, np.dtype(np.uint8), new.shape[1]).reshape(new.shape)
            self._seq += 1
            rec = Record(ctx, offs, old, new, self._seq)
            now = self.clock() if when is None else when
            for page in range(rec.lo >> _PAGE_SHIFT, ((rec.hi - 1) >> _PAGE_SHIFT) + 1):
                times, recs = self.history.setdefault((a.key, page), ([], []))
                k = bisect_right(times, now)  # keep the log sorted by time
                times.insert(k, now)
                recs.insert(k, rec)
            self._logged.add(a.key)
        self._write(a, offs, new)

    def flush(self, ctx: Any, e: Entry) -> None:
        """The scheduler's delay for `e` expired: it lands in MEMORY (coherently)."""
        if e.state == BLOCK:
            self._land_through(ctx.pending, e, BLOCK, self._to_memory)
        elif e.state == DEVICE:
            self._land_through(self.device_pending[e.dev], e, DEVICE, self._commit)

    def _land_through(self, queue: list, e: Entry, state: int, land: Callable) -> None:
        """Land `e` and, first, the older entries of its queue it overlaps (coherence: a
        location's stores land in order); now and then drop landed entries from the queue."""
        for p in queue:
            if p is e:
                break
            if p.state == state and p.overlaps(e.alloc, e.lo, e.hi):
                land(p)
        land(e)
        self._flushes += 1
        if len(queue) > 32 and self._flushes % 16 == 0:
            queue[:] = [p for p in queue if p.state == state]

    def _to_memory(self, e: Entry) -> None:
        for p in self.device_pending.get(e.dev, ()):  # older at the device level
            if p.state == DEVICE and p.overlaps(e.alloc, e.lo, e.hi):
                self._commit(p)
        self._commit(e)

    def _land_overlapping(self, ctx: Any, a: Allocation, lo: int, hi: int) -> None:
        """Before a direct write or an atomic: what this block, or any device level, still
        holds for these bytes lands first."""
        for p in ctx.pending:
            if p.state == BLOCK and p.overlaps(a, lo, hi):
                self._to_memory(p)
        for level in self.device_pending.values():
            for p in level:
                if p.state == DEVICE and p.overlaps(a, lo, hi):
                    self._commit(p)

    def drain(self, ctx: Any, scope: str = "system", waves: list | None = None) -> None:
        """Release at `scope` by the `waves` of block ctx (None: all of them): their own
        pending stores and those before a block barrier move on; other waves' stay."""
        keep = []
        if scope != "agent":
            level = self.device_pending.pop(ctx.rank, [])
            for p in level:
                if p.state == DEVICE:
                    self._commit(p)
        move = []
        for p in ctx.pending:
            if p.state != BLOCK:
                continue
            if waves is None or p.fenced or p.waves is None:
                move.append(p)
                continue
            mine = np.isin(p.waves, waves)
            if mine.all():
                move.append(p)
            elif not mine.any():
                keep.append(p)
            else:  # lanes of the releasing waves go, the others stay behind
                part = Entry(p.alloc, p.starts[mine], p.data[mine], ctx, None)
                rest = ~mine
                p.starts, p.data, p.waves = p.starts[rest], p.data[rest], p.waves[rest]
                p.lo, p.hi = int(p.starts.min()), int(p.starts.max()) + p.data.shape[1]
                move.append(part)
                keep.append(p)
                if scope == "agent":
                    self.on_buffer(ctx, part)  # the split-off part needs its own landing time
        for p in move:
            if scope == "agent":
                self._to_device(p)
            else:
                self._commit(p)
        ctx.pending[:] = keep

    # ------------------------------------------------------------------ atomics
    def atomic(self, ctx: Any, addrs: np.ndarray, fn: Callable[[np.ndarray, np.ndarray],
               np.ndarray], vals: np.ndarray, dt: np.dtype, cmp: np.ndarray | None = None
               ) -> np.ndarray:
        """Read-modify-write on memory: returns old values; lanes on the same address are
        serialized in lane order. `fn(old, val)` gives the new value (cmp: compare-swap)."""
        out = np.zeros(len(addrs), dt)
        size = dt.itemsize
        for a, sel, offs in self._groups(addrs, size, "atomic"):
            if (offs % size).any():
                raise SimMemoryFault(f"misaligned atomic at {a.name}+{int(offs[0]):#x}")
            self._land_overlapping(ctx, a, int(offs.min()), int(offs.max()) + size)
            v = vals if sel is None else vals[sel]
            c = None if cmp is None else (cmp if sel is None else cmp[sel])
            view = a.view(dt)
            idx = offs // size
            uniq = np.unique(idx)
            before = view[uniq].copy()
            old = apply_atomic(view, idx, fn, v, c)
            after = view[uniq].copy()
            view[uniq] = before  # write again through the log
            self._write_logged(ctx, a, uniq * size, bytes_of(after, len(uniq)), None)
            if sel is None:
                out = old
            else:
                out[sel] = old
            self.writes += 1
        return out
