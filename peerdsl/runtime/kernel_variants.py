"""Which variant of a collective kernel a path launches: the all-reduce kernels' B, U, E
(`ar_kernel`, table `AR_KERNELS`) and the fused two-stage kernel's schedule
(`fused_2stage_kernel`, table `FUSED_2STAGE`). runtime/dispatch.py picks the path and
re-exports these; the environment overrides and plan caches are dispatch's (imported at
call time: dispatch imports this module as it loads, so either may be imported first).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ..ops._row_slots import NORM_BLOCK


@dataclasses.dataclass(frozen=True)
class ArKernel:
    """A target's variant of the one- or two-stage all-reduce kernel for one world size."""
    block: int             # B: threads per block
    max_unroll: int        # U: packs per thread per iteration, at most this (see ar_kernel)
    end_barrier: int = 1   # E: the two-stage kernel's end barrier (1) or none (0)


UNROLLS = (1, 2, 4)  # the U values built (ops/_collective.py AR_UNROLLS)

# Provisional sm_90 choices, from the hypothesis that these kernels were latency-bound (too
# few bytes in flight: 256 threads x W packs per SM at TP4) until the sweep
# (`benchmarks/bench_ar_rms.py --ar-variants`) measures them. Each keeps >= 2 blocks per SM
# at the registers ptxas gives it (ops/_collective.py), so the blocks of every rank sharing
# the GPU fit with slack (one block per SM per rank is what the grid cap launches; an exact
# fit timed out under MPS, benchmarks/RESULTS.md). E = 0: vLLM's two-stage kernel has no end
# barrier either (ops/allreduce_2stage.py says why that is safe).
_SM90_AR = {2: ArKernel(512, 4), 4: ArKernel(256, 4), 8: ArKernel(256, 2)}
AR_KERNELS: dict[str, dict[str, dict[int, ArKernel]]] = {
    "sm_90": {"1stage": _SM90_AR,
              "2stage": {w: dataclasses.replace(k, end_barrier=0) for w, k in _SM90_AR.items()}},
}
_AR_KERNEL_PLANS: dict[tuple, Any] = {}


def ar_kernel(arch: str, path: str, world: int, work_packs: int,
              max_grid: int) -> tuple[dict[str, int], int]:
    """(constexprs beyond T and W, packs one block covers per iteration) of the `path`
    ("1stage" | "2stage") all-reduce kernel for `work_packs` packs per grid (the two-stage
    kernel's shard) with at most `max_grid` blocks.

    U is the smallest built unroll whose grid of max_grid blocks covers the work in one
    iteration, at most the table's max_unroll: small inputs spread over the grid first,
    large ones get U * W loads in flight per thread. PEERDSL_AR_BLOCK, PEERDSL_AR_UNROLL and
    PEERDSL_AR_END_BARRIER override B, U and E on any target (a variant that is not built
    fails at launch, naming the built ones)."""
    from .dispatch import _cached, _env_key
    key = (arch, path, world, work_packs, max_grid, _env_key())
    return _cached(_AR_KERNEL_PLANS, key, lambda: _ar_kernel(arch, path, world, work_packs,
                                                             max_grid))


def _ar_kernel(arch: str, path: str, world: int, work_packs: int,
               max_grid: int) -> tuple[dict[str, int], int]:
    from .dispatch import _AR_ENV, _env_ints
    if path not in ("1stage", "2stage"):
        raise ValueError(f"ar_kernel path {path!r} is not '1stage' or '2stage'")
    env = _env_ints(_AR_ENV)
    if "end_barrier" in env and env["end_barrier"] not in (0, 1):
        raise ValueError(f"PEERDSL_AR_END_BARRIER={env['end_barrier']} must be 0 or 1")
    if "unroll" in env and env["unroll"] < 1 or "block" in env and env["block"] < 32:
        raise ValueError(f"PEERDSL_AR_UNROLL must be >= 1 and PEERDSL_AR_BLOCK >= 32, got "
                         f"{env}")
    table = AR_KERNELS.get(arch, {}).get(path, {}).get(world)
    if table is None and not env:
        return {}, 256  # the build's one {T, W} variant
    base = table or ArKernel(256, 1)
    block = env.get("block", base.block)
    unroll = env.get("unroll")
    if unroll is None:
        need = -(-work_packs // (block * max(1, max_grid)))
        fits = [u for u in UNROLLS if u >= need and u <= base.max_unroll]
        unroll = fits[0] if fits else base.max_unroll
    cx = {"U": unroll, "B": block}
    if path == "2stage":
        cx["E"] = env.get("end_barrier", base.end_barrier)
    return cx, block * unroll


# The fused two-stage kernel's schedule per target and world size (ops/fused_ar_rms_2stage.py
# U, V, E); targets without an entry launch the build's default schedule. sm_90: U = 4 shard
# packs and V = 2 rows per thread in flight, no end barrier (fitted: V = 1 at H = 8192), the
# fastest or within 2% of it at every TP4 row count from 256 in call F1 (RESULTS.md), e.g.
# 6144 x 4096 rows 274.6 us against 347.3 for the default schedule.
# split_hidden: the specialized H at which the kernel runs S = 1, stage 1 alone, and the
# gather kernel after it with a grid of one block per row; split_bounds: the runtime-H bounds
# MAXH at which it does. 2048 and 4096 (call N2, 2026-12-07, two sweeps: from 1024 rows the
# split kernel was the fastest at MAXH 2048 (H = 2048: TP4 4096 rows 137.6 / 138.2 us against
# 156.9 / 159.1 for U4V2) and fastest or even at MAXH 4096 (H = 3584: TP4 1024 rows 63.9 /
# 64.8 against 67.9 / 68.0), and 7-16% slower than the fastest path from 1024 rows at MAXH
# 6144 (H = 5120)). 2880 (call G4): TP4 4096 rows 173.6 us against 213.6 for U4V2 and 188.7
# for our unfused pair, TP2 90.3 against 122.9 for the one-stage kernel; M3 (2026-12-07) kept
# it the fastest from 1024 rows. Calls M5 and M6 (2026-12-07, two sweeps, H100) measured the
# other sizes: TP4 7168 split while its norm kernels ran 256 threads a row, 3.5 slots each
# (4096 rows 443.1 / 443.1 against 490.2 / 489.0 for U4V1), but with 224 threads (four full
# slots, lowering/targets.py norm_threads) the one-launch U4V1 was ahead at every row count
# in call M9's sweep (413.0 against 424.4 at 4096 rows, 112.4 against 121.8 at 1024, one
# sample); TP4 4096 does not split (4096 rows 247.3 / 247.9 against 238.7 / 239.4 for U4V2,
# even below); nor does TP2 4096 (the one-stage rows kernel 33.3 / 33.6 against 38.0 / 35.9
# at 1024 rows, 106.7 / 108.2 against 132.9 / 135.1 at 4096); at 6144 and 8192 it lost (M6
# TP4 4096 rows 373.2 against 340.6, 481.3 against 460.1). W = 8 is not measured.
# The runtime-H kernel takes the same schedules at its bound MAXH (it ran split up to MAXH
# 8192 while its one-launch schedule held fewer rows and packs ahead than the specialized
# one's, 1.12-1.18x of it in call G5; its predicated slot reads, ops/_row_slots.py slot_pack,
# now fit the specialized schedules without spilling: 1.00-1.03x of them in call H5).
# TP4's split_bounds also name MAXH 12288 and 16384, which build only the default one-launch
# schedule (U0V1E1: the others spilled), and the split kernel (U0V1E0S1) beat it at every TP4
# row count in call P3 (2026-12-07, H100, two sweeps: H = 12288 x 1024 rows 232.4 / 230.2 us
# against 259.9 / 259.0, 16384 x 2048 550.1 / 553.7 against 619.2 / 621.9, 10240 x 256 60.4 /
# 63.5 against 67.7 / 71.1); at TP2 it lost to the one-stage kernel (16384 x 256 rows 49.2 /
# 48.5 against 42.8 / 41.4), and the TP2 table does not name them.
# V1_max_rows: a call of at most this many rows takes V = 1 (call L3, 2026-12-06, TP4: the
# two-stage kernel from 64 rows, where V = 1 beat V = 2 in the J2 and L2 sweeps and in L3,
# H = 6144 256 rows 30.7 / 31.0 us against 32.3 / 32.5; at 1024 rows V = 2 was 2-4% ahead).
_SM90_FUSED: dict[str, Any] = {"U": 4, "V": 2, "E": 0}
FUSED_2STAGE: dict[str, dict[int, dict[str, Any]]] = {"sm_90": {
    2: {**_SM90_FUSED, "split_hidden": (2880,), "split_bounds": (2048, 4096)},
    4: {**_SM90_FUSED, "split_hidden": (2880,), "split_bounds": (2048, 4096, 12288, 16384),
        "V1_max_rows": 256},
    8: _SM90_FUSED}}
_FUSED_KERNEL_PLANS: dict[tuple, Any] = {}


def fused_2stage_kernel(arch: str, world: int, hidden: int, runtime_h: bool = False,
                        rows: int | None = None, threads: int = NORM_BLOCK) -> dict[str, int]:
    """The constexprs beyond T, H/MAXH, W and FP8 of the fused two-stage kernel:
    `FUSED_2STAGE`'s schedule (V = 1 for a call of at most its `V1_max_rows` rows, where
    `rows` is given), with PEERDSL_FUSED_UNROLL, PEERDSL_FUSED_ROWS,
    PEERDSL_FUSED_END_BARRIER and PEERDSL_FUSED_SPLIT overriding U, V, E and S (a schedule
    that is not built fails at launch, naming the built ones). S = 1: the kernel does stage
    1 only and the caller launches ops/fused_ar_rms_gather.py after it. `hidden` is the
    kernel's H (or MAXH, `runtime_h`; both kernels take the same schedule for it), built
    with `threads` a row (its B): U and V are capped where they would not fit the
    registers (ops/fused_ar_rms_2stage.py `fitted_schedule`)."""
    from .dispatch import _cached, _env_key
    few = rows is not None and rows <= _schedule(arch, world).get("V1_max_rows", 0)
    key = (arch, world, hidden, runtime_h, few, threads, _env_key())
    return _cached(_FUSED_KERNEL_PLANS, key,
                   lambda: _fused_2stage_kernel(arch, world, hidden, runtime_h, few, threads))


def fused_2stage_splits(arch: str, world: int, hidden: int, runtime_h: bool = False) -> bool:
    """Whether `FUSED_2STAGE` runs the kernel split (S = 1) for the specialized H `hidden`,
    or, `runtime_h`, for the runtime-H kernel of bound MAXH `hidden`."""
    table = _schedule(arch, world)
    return hidden in table.get("split_bounds" if runtime_h else "split_hidden", ())


def _schedule(arch: str, world: int) -> dict[str, int]:
    return FUSED_2STAGE.get(arch, {}).get(world, {})


def _fused_2stage_kernel(arch: str, world: int, hidden: int, runtime_h: bool = False,
                         few_rows: bool = False, threads: int = NORM_BLOCK) -> dict[str, int]:
    from ..ops.fused_ar_rms_2stage import SPLIT_UNROLL, fitted_schedule
    from .dispatch import _FUSED_ENV, _env_ints
    table = _schedule(arch, world)
    env = _env_ints(_FUSED_ENV)
    cx = {k: v for k, v in table.items() if k in ("U", "V", "E")}
    if cx:
        if few_rows:
            cx["V"] = 1
        # (PEERDSL_FUSED_SPLIT decides before the fit: the two forms fit different U)
        split = bool(env.get("S", fused_2stage_splits(arch, world, hidden, runtime_h)))
        if split:
            cx.update(U=SPLIT_UNROLL, V=1, S=1)  # the split variant's build (schedules())
        cx["U"], cx["V"] = fitted_schedule(hidden, world, cx["U"], cx["V"], threads, split)
        if (cx["U"], cx["V"]) == (0, 1) and not cx.get("S"):
            cx["E"] = 1  # the default schedule, built with its end barrier
    for field, value in env.items():
        name, low = _FUSED_ENV[field], 1 if field == "V" else 0
        flag = field in ("E", "S")
        if value < low or flag and value > 1:
            raise ValueError(f"{name}={value} must be {'0 or 1' if flag else f'>= {low}'}")
        cx[field] = value
    if not table and cx.get("S") == 0:
        del cx["S"]  # "not split" is what a target without schedules builds anyway
    if not cx:
        return cx
    # a partial override of a target without an entry: the kernel's defaults
    if cx.get("S"):  # stage 1 alone: built with V = 1 and no end barrier (V, E overrides
        return {"U": cx.get("U", 0), "V": 1, "E": 0, "S": 1}  # do not apply to it)
    plan = {"U": cx.get("U", 0), "V": cx.get("V", 1), "E": cx.get("E", 1)}
    return {**plan, "S": 0} if table else plan  # sm_90's schedules all name S


# Targets whose fused one-stage kernel takes several rows per block iteration where rows
# outnumber the blocks (ops/fused_ar_rms_1stage.py `fused_ar_rms_1stage_rows`, built for
# the (H, W) of its ROWS_FIT), and the largest V dispatch picks by itself. Under MPS on the
# H200 a TP4 rank has 33 blocks, so from 34 rows the plain kernel's blocks take their rows
# one after the other. V = 2 ran on the H200 (call I2, RESULTS.md: the runtime proof, and
# 1.04-1.18x at 7 of 10 cells, within the run-to-run spread); V = 4 (H = 2880) is built and
# simulator-tested but not yet measured there, so it is taken only when forced
# (PEERDSL_FUSED_1STAGE_ROWS=4). Per world size: at TP4 the plain kernel was faster in 9 of
# 10 cells of the J2 sweeps (64-256 rows) and in call L3 (2026-12-06, H = 2880 64 rows 9.3 /
# 9.7 us against 10.6-12.9, 128 rows 12.4 / 12.0 against 12.8-14.1), so TP4 takes none; at
# TP2 V = 2 was 2-6% ahead from 1024 rows (J2, L2) and even at 128-256.
FUSED_1STAGE_ROWS: dict[str, dict[int, int]] = {"sm_90": {2: 2}}


def fused_1stage_rows(arch: str, world: int, rows: int, hidden: int, max_grid: int) -> int:
    """V, the rows per block iteration of the fused one-stage path's specialized kernel for
    `rows` rows of H = `hidden` with at most `max_grid` blocks: 1 (the plain kernel) where
    the rows fit one per block or the target builds no multi-row kernel for (H, W), else the
    smallest built V up to the target's FUSED_1STAGE_ROWS that covers the rows in one
    iteration (the largest of those where none does). PEERDSL_FUSED_1STAGE_ROWS=V forces V
    (1: off; one not built for (H, W): a ValueError naming those that are). Not cached: its
    caller, runtime/fused_launch.py `fused_kernel`, caches the whole launch plan."""
    from ..ops.fused_ar_rms_1stage import rows_in_flight
    from .dispatch import _ROWS_ENV, _env_ints
    built = rows_in_flight(hidden, world) if arch in FUSED_1STAGE_ROWS else ()
    most = FUSED_1STAGE_ROWS.get(arch, {}).get(world, 1)
    forced = _env_ints({"V": _ROWS_ENV}).get("V")
    if forced is not None:
        if forced != 1 and forced not in built:
            raise ValueError(f"{_ROWS_ENV}={forced}: the fused one-stage kernel is built with "
                             f"V in {[1, *built]} rows per iteration for H={hidden}, "
                             f"W={world} on {arch}")
        return forced
    picks = [v for v in built if v <= most]
    need = -(-rows // max(1, max_grid))  # rows per block in one iteration
    if need <= 1 or not picks:
        return 1
    return next((v for v in picks if v >= need), picks[-1])
