"""Simulated global memory of every device: allocations, addresses and raw accesses.

Addresses are 64-bit: `key << 32 | offset`, where `key = (device + 1) << 16 | allocation`.
Every allocation of every device lives in one `GlobalMemory`, so any rank resolves any
address (a peer pointer is just another device's address); 0 and garbage fault. The memory
model (what a load sees, when a store lands) is `weak.WeakMemory`, built on this.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..errors import SimMemoryFault

_OFF_MASK = np.int64(0xFFFFFFFF)


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


def apply_atomic(view: np.ndarray, idx: np.ndarray, fn: Callable[[np.ndarray, np.ndarray],
                 np.ndarray], v: np.ndarray, c: np.ndarray | None) -> np.ndarray:
    """Read-modify-write `view[idx]` for each lane; lanes on one element go in lane order.
    `fn(old, v)` gives the new value, or with `c` a compare-swap. Returns the old values."""
    if len(np.unique(idx)) == len(idx):
        old = view[idx].copy()
        view[idx] = fn(old, v) if c is None else np.where(old == c, v, old)
        return old
    old = np.empty(len(idx), view.dtype)
    for i, j in enumerate(idx):
        cur = view[j:j + 1].copy()
        old[i] = cur[0]
        if c is None:
            view[j] = fn(cur, v[i:i + 1])[0]
        elif cur[0] == c[i]:
            view[j] = v[i]
    return old


def bytes_of(vals: np.ndarray, k: int) -> np.ndarray:
    return np.ascontiguousarray(vals).view(np.uint8).reshape(k, -1)


class GlobalMemory:
    """All allocations of all devices, and the primitive accesses on them."""

    def __init__(self) -> None:
        self.allocs: dict[int, Allocation] = {}
        self._next: dict[int, int] = {}
        # allocation name -> fn(offset) naming what lives there (e.g. the Signal's words)
        self.describers: dict[str, Callable[[int], str]] = {}

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
