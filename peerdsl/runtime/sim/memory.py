"""Simulated global memory of every device, and the weak memory model (per-block store buffers).

Addresses are 64-bit: `key << 32 | offset`, where `key = (device + 1) << 16 | allocation`.
Every allocation of every device lives in one `GlobalMemory`, so any rank resolves any
address (a peer pointer is just another device's address); 0 and garbage fault.

Memory model (weak enough to catch missing release/acquire and missing barriers):
  * A plain or relaxed store (scalar or 16-byte pack) goes into the writing block's store
    buffer as one entry; entries become visible to other blocks individually, in an order
    the scheduler chooses (not FIFO: a later relaxed flag may land before earlier data).
  * Same-location order is kept (coherence): flushing an entry first flushes the earlier
    entries of that block that overlap it.
  * A block's own loads see its pending stores (store-to-load forwarding).
  * A release (store, atomic, fence) at agent or system scope drains the block's buffer
    first; the release store / atomic then acts on memory directly. Workgroup scope only
    orders inside the block, and the whole block runs in lockstep, so it drains nothing.
  * The end of a launch drains everything.
  * Loads: a plain (unscoped) load may be served stale: it returns memory as it was at a
    moment the scheduler picks between the block's last acquire (load/atomic/fence with
    acquire at agent or system scope, or the launch start) and now, except for the block's
    own writes. So data read without an acquire after the flag that published it may be
    old, as with non-coherent L0/L1 caches or reordered loads. Scoped loads (atomics,
    volatile LL lines) always read the latest value.
Every write during a launch is logged (time, writer, old and new bytes) to serve stale
reads; the log is dropped at the end of the launch.
"""
from __future__ import annotations

from bisect import bisect_right
from typing import Any, Callable

import numpy as np

from ..errors import SimMemoryFault

_OFF_MASK = np.int64(0xFFFFFFFF)
_PAGE_SHIFT = 12  # the write log is indexed by 4 KiB pages


class Allocation:
    __slots__ = ("key", "device", "name", "nbytes", "buf", "_views")

    def __init__(self, key: int, device: int, name: str, nbytes: int):
        self.key = key
        self.device = device
        self.name = name
        self.nbytes = nbytes
        padded = max(16, (nbytes + 15) // 16 * 16)
        self.buf = np.zeros(padded, np.uint8)  # calloc: untouched pages cost nothing
        self._views: dict[Any, np.ndarray] = {}

    @property
    def addr(self) -> int:
        return self.key << 32

    def view(self, dt: np.dtype) -> np.ndarray:
        v = self._views.get(dt)
        if v is None:
            v = self._views[dt] = self.buf.view(dt)
        return v

    def rows(self, n: int) -> np.ndarray:
        v = self._views.get(("rows", n))
        if v is None:
            v = self._views[("rows", n)] = self.buf.reshape(-1, n)
        return v


class Record:
    """One logged write: when, by which block, and the bytes before and after."""
    __slots__ = ("ctx", "starts", "old", "new", "lo", "hi", "seq")

    def __init__(self, ctx: Any, starts: np.ndarray, old: np.ndarray, new: np.ndarray,
                 seq: int):
        self.ctx, self.starts, self.old, self.new, self.seq = ctx, starts, old, new, seq
        self.lo = int(starts.min())
        self.hi = int(starts.max()) + old.shape[1]


class Entry:
    """One pending store of one block: the bytes of the active lanes into one allocation."""
    __slots__ = ("alloc", "starts", "data", "lo", "hi", "done", "seq")

    def __init__(self, alloc: Allocation, starts: np.ndarray, data: np.ndarray, seq: int):
        self.alloc = alloc
        self.starts = starts          # int64 byte offsets, one per lane
        self.data = data              # uint8 [lanes, nbytes]
        self.lo = int(starts.min())
        self.hi = int(starts.max()) + data.shape[1]
        self.done = False
        self.seq = seq


def _bytes_of(vals: np.ndarray, k: int) -> np.ndarray:
    return np.ascontiguousarray(vals).view(np.uint8).reshape(k, -1)


class GlobalMemory:
    """All allocations of all devices, and the primitive accesses on them."""

    def __init__(self) -> None:
        self.allocs: dict[int, Allocation] = {}
        self._next: dict[int, int] = {}
        self.writes = 0  # bumped whenever memory changes hands (progress for the deadlock check)
        self.on_buffer: Callable[[Any, Entry], None] = lambda ctx, e: None
        # allocation name -> fn(offset) naming what lives there (e.g. the Signal's words)
        self.describers: dict[str, Callable[[int], str]] = {}
        # set by the scheduler during a launch: the clock, and the moment a plain load of a
        # block reads memory at (None: loads always read the latest bytes)
        self.clock: Callable[[], int] = lambda: 0
        self.stale_time: Callable[[Any], int] | None = None
        # (allocation key, 4 KiB page) -> (times, records) of the writes touching the page
        self.history: dict[tuple[int, int], tuple[list[int], list[Record]]] = {}
        self._logged: set[int] = set()  # allocation keys with a logged write
        self._seq = 0

    # ------------------------------------------------------------------ allocation
    def allocate(self, device: int, nbytes: int, name: str = "") -> Allocation:
        n = self._next.get(device, 1)
        if n >= 1 << 16:
            raise SimMemoryFault(f"device {device}: too many allocations")
        self._next[device] = n + 1
        key = (device + 1) << 16 | n
        a = Allocation(key, device, name or f"buf{n}", nbytes)
        self.allocs[key] = a
        return a

    def free(self, alloc: Allocation) -> None:
        self.allocs.pop(alloc.key, None)

    def resolve(self, addr: int) -> tuple[Allocation, int]:
        a = self.allocs.get(addr >> 32)
        if a is None:
            raise SimMemoryFault(f"address {addr:#x} is not in any allocation")
        return a, addr & 0xFFFFFFFF

    def describe(self, addr: int) -> str:
        a = self.allocs.get(int(addr) >> 32)
        if a is None:
            return f"{int(addr):#x} (unmapped)"
        off = int(addr) & 0xFFFFFFFF
        text = f"rank {a.device} {a.name}+{off:#x}"
        d = self.describers.get(a.name)
        extra = d(off) if d else ""
        return f"{text} ({extra})" if extra else text

    def _groups(self, addrs: np.ndarray, nbytes: int, what: str):
        """(allocation, lane selector or None, byte offsets) for each allocation touched."""
        keys = addrs >> 32
        k0 = int(keys[0])
        if (keys == k0).all():
            groups = [(k0, None)]
        else:
            groups = [(int(k), keys == k) for k in np.unique(keys)]
        out = []
        for k, sel in groups:
            a = self.allocs.get(k)
            offs = (addrs if sel is None else addrs[sel]) & _OFF_MASK
            if a is None:
                bad = int((addrs if sel is None else addrs[sel])[0])
                raise SimMemoryFault(f"{what} of {nbytes} B at {bad:#x}: not an allocated "
                                     "address (null, freed or garbage pointer)")
            if int(offs.max()) + nbytes > a.nbytes:
                raise SimMemoryFault(f"{what} of {nbytes} B at {a.name}+{int(offs.max()):#x} "
                                     f"(rank {a.device}) runs past its end ({a.nbytes} B)")
            out.append((a, sel, offs))
        return out

    # ------------------------------------------------------------------ raw access
    @staticmethod
    def _read(a: Allocation, offs: np.ndarray, dt: np.dtype, count: int) -> np.ndarray:
        size = dt.itemsize * max(count, 1)
        if count == 0:
            if (offs % size == 0).all():
                return a.view(dt)[offs // size]
            idx = offs[:, None] + np.arange(size)
            return a.buf[idx].view(dt).reshape(-1)
        if size in (4, 8, 16) and (offs % size == 0).all():
            return a.rows(size)[offs // size].view(dt)
        idx = offs[:, None] + np.arange(size)
        return a.buf[idx].view(dt)

    @staticmethod
    def _write(a: Allocation, offs: np.ndarray, data: np.ndarray) -> None:
        n = data.shape[1]
        if n in (1, 2, 4, 8, 16) and (offs % n == 0).all():
            a.rows(n)[offs // n] = data
        else:
            a.buf[(offs[:, None] + np.arange(n)).ravel()] = data.ravel()

    @staticmethod
    def _overlay(starts: np.ndarray, data: np.ndarray, offs: np.ndarray, raw: np.ndarray) -> None:
        """Patch the bytes `raw` [k, n] read at `offs` with bytes `data` written at `starts`."""
        n = raw.shape[1]
        if data.shape[1] == n and starts.shape == offs.shape and (starts == offs).all():
            raw[:] = data
            return
        ea = (starts[:, None] + np.arange(data.shape[1])).ravel()
        order = np.argsort(ea, kind="stable")  # stable: the last duplicate is the last lane
        sea = ea[order]
        la = (offs[:, None] + np.arange(n)).ravel()
        idx = np.searchsorted(sea, la, side="right") - 1
        hit = idx >= 0
        hit[hit] = sea[idx[hit]] == la[hit]
        flat = raw.reshape(-1)
        flat[hit] = data.reshape(-1)[order[idx[hit]]]

    # ------------------------------------------------------------------ model
    def load(self, ctx: Any, addrs: np.ndarray, dt: np.dtype, count: int,
             plain: bool = False) -> np.ndarray:
        size = dt.itemsize * max(count, 1)
        groups = self._groups(addrs, size, "load")
        out = None
        for a, sel, offs in groups:
            vals = self._read(a, offs, dt, count)
            lo, hi = int(offs.min()), int(offs.max()) + size
            if plain and self.stale_time is not None and a.key in self._logged:
                vals = self._stale(ctx, a, offs, vals, lo, hi, size)
            pend = ctx.pending
            if pend:
                for e in pend:
                    if e.alloc is a and e.lo < hi and lo < e.hi and not e.done:
                        vals = np.ascontiguousarray(vals)
                        raw = vals.view(np.uint8).reshape(len(offs), size)
                        self._overlay(e.starts, e.data, offs, raw)
            if sel is None:
                return vals
            if out is None:
                shape = (len(addrs),) if count == 0 else (len(addrs), count)
                out = np.zeros(shape, dt)
            out[sel] = vals
        return out

    def _stale(self, ctx, a, offs, vals, lo, hi, size):
        """Undo other blocks' writes logged after the moment this load reads at."""
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

    def _log(self, ctx: Any, a: Allocation, offs: np.ndarray, new: np.ndarray) -> None:
        """Write `new` [k, n] bytes at offs, logging the old bytes for stale reads."""
        if self.stale_time is not None:
            old = self._read(a, offs, np.dtype(np.uint8), new.shape[1]).reshape(new.shape)
            self._seq += 1
            rec = Record(ctx, offs, old, new, self._seq)
            now = self.clock()
            for page in range(rec.lo >> _PAGE_SHIFT, ((rec.hi - 1) >> _PAGE_SHIFT) + 1):
                times, recs = self.history.setdefault((a.key, page), ([], []))
                times.append(now)
                recs.append(rec)
            self._logged.add(a.key)
        self._write(a, offs, new)

    def store(self, ctx: Any, addrs: np.ndarray, vals: np.ndarray, buffered: bool) -> None:
        k = len(addrs)
        data = _bytes_of(vals, k)
        for a, sel, offs in self._groups(addrs, data.shape[1], "store"):
            d = data if sel is None else data[sel]
            if buffered:
                ctx.seq += 1
                e = Entry(a, offs, d, ctx.seq)
                ctx.pending.append(e)
                self.on_buffer(ctx, e)
            else:
                self._flush_overlapping(ctx, a, int(offs.min()), int(offs.max()) + d.shape[1])
                self._log(ctx, a, offs, d)
                self.writes += 1

    def flush(self, ctx: Any, e: Entry) -> None:
        """Make one pending entry visible (after the earlier ones it overlaps)."""
        if e.done:
            return
        for p in ctx.pending:
            if p is e:
                break
            if not p.done and p.alloc is e.alloc and p.lo < e.hi and e.lo < p.hi:
                self._apply(ctx, p)
        self._apply(ctx, e)
        if len(ctx.pending) > 32:
            ctx.pending[:] = [p for p in ctx.pending if not p.done]

    def _apply(self, ctx: Any, e: Entry) -> None:
        self._log(ctx, e.alloc, e.starts, e.data)
        e.done = True
        self.writes += 1

    def _flush_overlapping(self, ctx: Any, a: Allocation, lo: int, hi: int) -> None:
        for p in ctx.pending:
            if not p.done and p.alloc is a and p.lo < hi and lo < p.hi:
                self._apply(ctx, p)

    def drain(self, ctx: Any) -> None:
        """Release: every pending store of the block becomes visible, in program order."""
        for p in ctx.pending:
            if not p.done:
                self._apply(ctx, p)
        ctx.pending.clear()

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
            self._flush_overlapping(ctx, a, int(offs.min()), int(offs.max()) + size)
            v = vals if sel is None else vals[sel]
            c = None if cmp is None else (cmp if sel is None else cmp[sel])
            view = a.view(dt)
            idx = offs // size
            uniq = np.unique(idx)
            before = view[uniq].copy()
            if len(uniq) == len(idx):
                old = view[idx].copy()
                new = fn(old, v) if c is None else np.where(old == c, v, old)
                view[idx] = new
            else:
                old = np.empty(len(idx), dt)
                for i, j in enumerate(idx):
                    o = view[j:j + 1].copy()
                    old[i] = o[0]
                    if c is None:
                        view[j] = fn(o, v[i:i + 1])[0]
                    elif o[0] == c[i]:
                        view[j] = v[i]
            if self.stale_time is not None:
                after = view[uniq].copy()
                view[uniq] = before
                self._log(ctx, a, uniq * size, _bytes_of(after, len(uniq)))
            if sel is None:
                out = old
            else:
                out[sel] = old
            self.writes += 1
        return out
