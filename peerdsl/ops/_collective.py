"""Pieces shared by the collective kernels: the grid-stride index, rank-order sums, and the
unrolled grid-stride loop of the one- and two-stage all-reduce."""
from __future__ import annotations

from typing import Any, Callable

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


def peer_packs(table: Any, P: Any, W: int, i: Any) -> list:
    """Pack i of every rank's buffer in `table`, in rank order (loads issued in that order)."""
    return [table[r].cast(P)[i] for r in range(W)]


def store_sum(dst: Any, i: Any, packs: list, T: Any) -> None:
    """dst[i] = T(rank-order f32 sum of packs), rounded to nearest even."""
    dst[i] = dsl.pack_rne(rank_order_sum(packs), T)


def unrolled_grid_stride(n: Any, U: int, load: Callable[[Any], Any],
                         store: Callable[[Any, Any], None]) -> None:
    """Visit every index j in [0, n) once: `store(j, load(j))`, grid-strided, U indices per
    thread per iteration, with the loads of all U issued before the first store.

    Why: a load after a store to memory the compiler cannot prove distinct cannot be moved
    above it, so a plain grid-stride loop has one iteration's loads in flight per thread and
    waits a full memory latency per iteration. Here iteration k of a thread covers
    i + u * stride (u < U, stride = the grid's threads), so with U = 1 this is the plain
    loop, and a block visits the same indices in every loop of one launch (the two-stage
    kernel's per-block phase barrier relies on it). Index u past n reloads index i (this
    thread's own, already in range: nothing another block wrote) and skips its store, so
    the bytes stored are those of the plain loop.
    """
    stride = grid_threads()
    for i in range(global_thread(), n, stride * U):
        idx = [i + u * stride for u in range(U)]
        valid = [j < n for j in idx]
        values = [load(idx[0])] + [load(dsl.select(valid[u], idx[u], i)) for u in range(1, U)]
        store(idx[0], values[0])
        for u in range(1, U):
            if valid[u]:
                store(idx[u], values[u])


def ar_variants(target: Any) -> list[dict[str, Any]]:
    """The constexprs the one- and two-stage all-reduce kernels are built with.

    AMD targets: {T, W} only (block 256, one pack per thread per iteration, end barrier),
    the set the gfx1250 build always had. sm_90 adds the variants runtime/dispatch.py picks
    from (`AR_KERNELS`) and the sweep times (benchmarks/bench_ar_variants.py): U packs per
    thread per iteration and B threads per block, kept where the U*W loaded packs (4
    registers each) fit half of the per-thread register budget a B-thread block leaves, so
    no variant spills. The two-stage kernel adds E (end barrier) in its own variants.
    """
    base = [{"T": T, "W": W} for T in (dsl.bf16, dsl.f16) for W in WORLDS]
    if not getattr(target, "is_nvidia", False):
        return base
    out = []
    for v in base:
        for B in AR_BLOCKS:
            for U in AR_UNROLLS:
                if fits_registers(U, v["W"], B):
                    out.append({**v, "U": U, "B": B})
    return out


AR_BLOCKS = (256, 512, 1024)
AR_UNROLLS = (1, 2, 4)


def fits_registers(U: int, W: int, B: int) -> bool:
    """U*W loaded packs of 4 registers each within half the registers per thread that a
    B-thread block may use (64K per SM, at most 255 each)."""
    budget = min(255, 65536 // B)
    return U * W * 4 <= budget // 2
