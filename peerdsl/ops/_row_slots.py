"""Which packs of a row a thread of a norm kernel owns, for a constexpr or a run-time hidden
size (the geometry ops/_rows.py computes over).

Thread t of a block of B threads owns the 16-byte packs t, t + B, t + 2 B, ... of the row,
where B is the block size the kernel is traced with (`norm_threads`): its constexpr B, which
`norm_block` gives per target and H, the same for every norm kernel, so that they share the
mapping and the reduction order. The hidden size H is either a Python int (the specialized
kernels' constexpr H: row loops unroll to exactly the packs the row has) or a
`RuntimeHidden` (the runtime-H kernels: a traced `hidden` and a constexpr bound; each thread
has the slots of the bound, and a slot past the row is masked at run time). A masked slot
holds exact zeros, so it adds +0 to a thread's sum of squares (which is never -0) and
nothing to its max: at the same B the reduction order is that of the specialized kernel,
and so are the bytes. Up to PREDICATED_PER_THREAD
slots a masked slot's loads are predicated off and give +0 packs (`slot_pack`), with no
branch around their uses, so that every load of a thread's row is in flight at once; above
it each slot's loads and their uses sit in a branch of their own.
"""
from __future__ import annotations

from typing import Any, Union

from .. import dsl

PACK = 8             # elements of a 16-byte bf16/f16 pack
SUPPORTED_HIDDEN = (2880, 4096, 6144, 7168, 8192)   # the specialized (constexpr H) sizes
NORM_BLOCK = 256
HIDDEN_MIN, HIDDEN_MAX = 256, 16384   # what the runtime-H kernels serve (multiples of PACK)
# the runtime-H classes: bounds of 1, 2, 3, 4, 6 and 8 packs per thread; a size H runs on
# the smallest bound >= H, so at most one slot of a thread (its last) is masked, and the
# common sizes 6144 and 12288 fill their bound as the specialized kernels do
RUNTIME_MAXH = tuple(NORM_BLOCK * PACK * n for n in (1, 2, 3, 4, 6, 8))
# Runtime-H bounds of at most this many packs per thread (MAXH <= 8192) read every slot
# through `slot_pack`, predicated: guarded, each slot's loads wait in their own branch (1.2-
# 1.46x the specialized kernels' time on the H200). The predicated reads hold the registers
# of the specialized kernels, so whole rows and two rows of MAXH 6144 fit (issue 15 item 5);
# at 6 packs (MAXH 12288) the fused one-stage kernel spilled 12 bytes (f16, W = 8) and at 8
# 16-64 bytes under sm_90's 128 registers, so its MAXH 12288 and 16384 keep the guarded
# reads. The one-block-per-row kernels (add + RMSNorm, the gather, the FP8 quant) may go
# further per target (lowering/targets.py `predicated_row_slots`, their constexpr P), and so
# may the one-stage kernel, per world size (one_stage_predicated_slots).
PREDICATED_PER_THREAD = 4


def norm_block(target: Any, hidden: int) -> int:
    """B, the threads that share a row, of every norm-family kernel of `target` specialized
    for `hidden` (lowering/targets.py `norm_threads`; NORM_BLOCK elsewhere, and for every
    runtime-H bound)."""
    return dict(getattr(target, "norm_threads", ())).get(hidden, NORM_BLOCK)


def collective_min_blocks(threads: int) -> int:
    """The blocks per SM a collective norm kernel (its blocks wait on peers' blocks) must
    fit with `threads` (its B): 2 above NORM_BLOCK, which fits 2 blocks even at 128
    registers a thread. Every rank sharing a GPU under MPS launches one block per SM, and a
    grid that fills the GPU exactly, with no second block's room, timed out under MPS
    (runtime/communicator.py max_grid); 0 (the compiler's choice) otherwise."""
    return 2 if threads > NORM_BLOCK else 0


def one_stage_predicated_slots(target: Any, world: int) -> int:
    """P of the fused one-stage runtime-H kernel at world size `world`: the target's
    `one_stage_predicated_slots` for that world (lowering/targets.py: a collective holds
    the W ranks' packs of each slot, so what fits shrinks as W grows), else
    PREDICATED_PER_THREAD."""
    return dict(getattr(target, "one_stage_predicated_slots", ())).get(
        world, PREDICATED_PER_THREAD)


def norm_min_blocks(hidden: int, threads: int = NORM_BLOCK) -> int:
    """The blocks per SM a one-block-per-row norm kernel asks the compiler to fit (its
    `min_blocks`; 0: the compiler's choice) for H, or a runtime-H kernel's MAXH, with
    `threads` (its B) per row. Such a
    kernel (add + RMSNorm, the split fused kernel's gather) keeps a row's loads in flight
    per block, so rows in flight per SM set its speed: at H = 2880 the Triton add + RMSNorm,
    at 4 rows per SM, ran 1.31x faster than ours at 3, and 4 blocks made ours 1.15-1.19x
    faster (calls H3, H4, RESULTS.md). Fitted to sm_90's registers with no spill (ptxas
    12.9): 4 blocks where a thread holds at most 2 packs (56-64 registers, from 63-101,
    runtime-H included); at 3 packs 4 blocks spilled 34 bytes, so the default there."""
    return 4 if -(-hidden // (PACK * threads)) <= 2 else 0


def hidden_rule_error(hidden: Any, entry: str = "") -> str | None:
    """Why `hidden` cannot be served by any kernel (None when it can); `entry` names the
    caller in the message."""
    if (not isinstance(hidden, int) or isinstance(hidden, bool) or hidden % PACK
            or not HIDDEN_MIN <= hidden <= HIDDEN_MAX):
        return (f"hidden size {hidden!r} is not supported{' for ' + entry if entry else ''}: "
                f"it must be a multiple of {PACK} in [{HIDDEN_MIN}, {HIDDEN_MAX}] (whole "
                "16-byte packs of bf16/fp16)")
    return None


def runtime_class(hidden: int, classes: "tuple[int, ...]" = RUNTIME_MAXH) -> int | None:
    """The smallest runtime-H bound (MAXH) of `classes` that covers `hidden`, else None."""
    return min((c for c in classes if c >= hidden), default=None)


def kernel_size(hidden: int, runtime_h: bool = False) -> tuple[int | None, bool]:
    """(H, False) where the specialized kernels serve `hidden`, else (its runtime-H bound
    MAXH, True): the size that picks a row kernel's variants and schedules (None past the
    largest bound). `runtime_h` forces the runtime-H kernel, as a communicator's
    force_runtime_h does. A build may still lack either (runtime/built.py row_kernel)."""
    if not runtime_h and hidden in SUPPORTED_HIDDEN:
        return hidden, False
    return runtime_class(hidden), True


class RuntimeHidden:
    """The hidden size of a runtime-H kernel: `hidden`, a traced i32 (a multiple of PACK in
    [1, max_hidden], which the host checks), and `max_hidden`, the constexpr bound that fixes
    how many pack slots each thread has."""

    def __init__(self, hidden: Any, max_hidden: int,
                 predicated: int = PREDICATED_PER_THREAD):
        step = PACK * norm_threads()
        if max_hidden % step:
            raise ValueError(f"MAXH={max_hidden} must be a multiple of {step}")
        self.hidden = hidden
        self.packs = hidden >> 3          # PACK elements per pack, hidden > 0
        self.per_thread = max_hidden // step
        self.predicated = predicated      # slots a thread may hold for reads to predicate


Hidden = Union[int, RuntimeHidden]   # what the row helpers take as H


def row_geometry(H: Hidden) -> tuple[Any, int]:
    """(packs per row, packs per thread): packs is traced for a RuntimeHidden."""
    if isinstance(H, RuntimeHidden):
        return H.packs, H.per_thread
    packs = H // PACK
    return packs, -(-packs // norm_threads())


def hidden_f32(H: Hidden) -> Any:
    """H as the f32 divisor of the mean of squares (exact: H <= 2^24 either way)."""
    if isinstance(H, RuntimeHidden):
        return H.hidden.to_f32()
    return float(H)


def pack_valid(H: Hidden, k: int) -> Any:
    """Whether this thread's k-th pack lies inside the row (a Python True when always)."""
    packs, _ = row_geometry(H)
    if not isinstance(H, RuntimeHidden):
        if packs % norm_threads() == 0:
            return True
    return dsl.thread_id() + k * norm_threads() < packs


def pack_index(k: int) -> Any:
    return dsl.thread_id() + k * norm_threads()


def norm_threads() -> int:
    """The threads that share a row: the block size of the kernel being traced."""
    return dsl.block_size()


def predicates_reads(H: Hidden) -> bool:
    """Whether the row helpers read every pack slot of H ahead, through `slot_pack`."""
    return isinstance(H, RuntimeHidden) and H.per_thread <= H.predicated


def slot_pack(vec: Any, i: Any, H: Hidden, k: int) -> Any:
    """vec[i]: the pack that this thread's k-th slot reads from vec. Where H predicates its
    reads (predicates_reads), a slot past the row gives a pack of +0 instead, the value a
    masked slot holds (module docstring). Only the load sits under `if valid`, its uses
    after it, so sm_90 predicates the load (`@!P LDG`) and the loads of every slot are in
    flight together. Why not a clamped index and masked values (the previous form): each
    slot's clamped index, and the 64-bit addresses made from it, stayed in registers
    across the row loop (20-24 more than the specialized kernels, whose slots are one base
    and constant offsets, as these are now); reading 4 slots ahead, or 2 rows of MAXH 6144,
    spilled 16-112 bytes."""
    if not predicates_reads(H):
        return vec[i]
    t = vec.elem
    v = dsl.pack([0.0 if t.elem.is_float else 0] * t.count, t.elem)
    if pack_valid(H, k):
        v = vec[i]
    return v
