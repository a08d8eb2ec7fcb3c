"""Shared memory of one block, with a race detector.

The simulator runs a whole block in lockstep, so a missing `barrier()` between one wave
writing shared memory and another wave reading it (or overwriting what another read) would
go unnoticed: the detector makes it an error instead. It keeps, per byte, the wave that last
wrote it and the waves that read it since the last barrier (an epoch count); an access that
conflicts with another wave's access of the same epoch raises `SimRace`. Atomics are not
tracked (they are race-free by definition). Lanes of one wave are not checked against each
other (waves execute in lockstep on every target the DSL supports).
"""
from __future__ import annotations

import numpy as np

from ..errors import SimMemoryFault, SimRace
from .memory import Allocation


class SharedMemory:
    def __init__(self, nbytes: int, wave: int, arrays: list[tuple[int, str]]):
        self.nbytes = nbytes
        self.alloc = Allocation(0, -1, "shared", max(nbytes, 16))
        self.wave = wave
        self.arrays = sorted(arrays)  # (byte offset, name) of each smem array
        n = max(nbytes, 1)
        self.w_wave = np.full(n, -1, np.int16)
        self.w_epoch = np.zeros(n, np.int32)
        self.r_bits = np.zeros(n, np.uint64)
        self.r_epoch = np.zeros(n, np.int32)
        self.epoch = 1

    def barrier(self) -> None:
        self.epoch += 1

    def _name(self, off: int) -> str:
        base, name = 0, "?"
        for o, nm in self.arrays:
            if o <= off:
                base, name = o, nm
        return f"{name}+{off - base}"

    def _bytes(self, lanes: np.ndarray, offs: np.ndarray, size: int, what: str):
        if len(offs) and (int(offs.min()) < 0 or int(offs.max()) + size > self.nbytes):
            bad = int(offs.max()) if int(offs.min()) >= 0 else int(offs.min())
            raise SimMemoryFault(f"shared {what} of {size} B at offset {bad} is outside the "
                                 f"block's {self.nbytes} B of shared memory")
        idx = (offs[:, None] + np.arange(size)).ravel()
        waves = np.repeat((lanes // self.wave).astype(np.int16), size)
        return idx, waves

    def _race(self, what: str, idx, waves, other, kind: str, loc: str) -> SimRace:
        i = int(np.flatnonzero(other)[0])
        return SimRace(f"shared-memory race at {loc}: wave {int(waves[i])} {what} "
                       f"{self._name(int(idx[i]))}, which another wave {kind} since the last "
                       "barrier(); separate the two accesses with a barrier()")

    def write_check(self, lanes: np.ndarray, offs: np.ndarray, size: int, loc: str) -> None:
        idx, waves = self._bytes(lanes, offs, size, "store")
        e = self.epoch
        waw = (self.w_epoch[idx] == e) & (self.w_wave[idx] != waves)
        if waw.any():
            raise self._race("writes", idx, waves, waw, "wrote", loc)
        bits = np.where(self.r_epoch[idx] == e, self.r_bits[idx], np.uint64(0))
        mine = np.left_shift(np.uint64(1), waves.astype(np.uint64))
        war = (bits & ~mine) != 0
        if war.any():
            raise self._race("writes", idx, waves, war, "read", loc)
        self.w_wave[idx] = waves
        self.w_epoch[idx] = e

    def read_check(self, lanes: np.ndarray, offs: np.ndarray, size: int, loc: str) -> None:
        idx, waves = self._bytes(lanes, offs, size, "load")
        e = self.epoch
        raw = (self.w_epoch[idx] == e) & (self.w_wave[idx] != waves)
        if raw.any():
            raise self._race("reads", idx, waves, raw, "wrote", loc)
        old = self.r_epoch[idx] != e
        self.r_bits[idx[old]] = 0
        self.r_epoch[idx] = e
        np.bitwise_or.at(self.r_bits, idx, np.left_shift(np.uint64(1), waves.astype(np.uint64)))
