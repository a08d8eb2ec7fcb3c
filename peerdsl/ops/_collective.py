"""Pieces shared by the collective kernels: the grid-stride index and rank-order sums."""
from __future__ import annotations

from typing import Any

from .. import dsl

BLOCK = 256
WORLDS = (2, 4, 8)


def global_thread() -> Any:
    return dsl.block_id() * dsl.block_size() + dsl.thread_id()


def grid_threads() -> Any:
    return dsl.num_blocks() * dsl.block_size()


def rank_order_sum(packs: list) -> list:
    """sum_r f32(x_r), added in rank order 0..n-1 starting from x_0 (SPEC 2.1).

    Starting from x_0 rather than 0.0 keeps the sign of an all-negative-zero sum.
    """
    acc = packs[0].to_f32()
    for p in packs[1:]:
        acc = [a + b for a, b in zip(acc, p.to_f32())]
    return acc
