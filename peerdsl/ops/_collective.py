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


def rank_order_sum(terms: list) -> list:
    """sum_r f32(x_r), added in rank order 0..n-1 starting from x_0 (SPEC 2.1). Every
    all-reduce path sums through here, so the order is the same on every path.

    `terms` holds one entry per rank: a T pack, or a list of f32 values. Starting from x_0
    rather than 0.0 keeps the sign of an all-negative-zero sum.
    """
    values = [t.to_f32() if isinstance(t, dsl.Vector) else t for t in terms]
    acc = values[0]
    for v in values[1:]:
        acc = [a + b for a, b in zip(acc, v)]
    return acc
