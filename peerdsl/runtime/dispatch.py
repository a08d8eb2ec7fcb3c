"""Which path a collective takes (SPEC section 5). Pure functions: no device, no MLIR.

The thresholds themselves, with the measurements behind sm_90's, are in runtime/thresholds.py;
this module applies them (first match, as SPEC section 5's table reads) and the PEERDSL_*
environment overrides, read at each call.

The one- and two-stage all-reduce kernels also come in variants (ops/_collective.py
`ar_variants`): B threads per block, U packs per thread per iteration, and for the two-stage
kernel E (its end barrier). `AR_KERNELS` holds a target's choice per path and world size;
targets without an entry launch the build's single {T, W} variant (gfx1250 and the other AMD
targets: block 256, U = 1, end barrier). See `ar_kernel`.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from .. import layout
from ..ops._row_slots import kernel_size
from .thresholds import TABLES, MiB, Thresholds  # noqa: F401 (MiB: re-exported)

PATHS = ("local", "unfused", "fallback", "ll+rmsnorm", "fused_1stage", "fused_2stage")
AR_PATHS = ("local", "fallback", "ll", "1stage", "2stage")
DTYPE_BYTES = {"bf16": 2, "f16": 2, "bfloat16": 2, "float16": 2, "torch.bfloat16": 2,
               "torch.float16": 2}

_ENV = {
    "ll_max_bytes": "PEERDSL_LL_MAX_BYTES",
    "custom_ar_max_bytes": "PEERDSL_CUSTOM_AR_MAX_BYTES",
    "staging_bytes": "PEERDSL_STAGING_BYTES",
    "two_stage_min_world": "PEERDSL_TWO_STAGE_MIN_WORLD",
    "two_stage_min_hidden": "PEERDSL_TWO_STAGE_MIN_HIDDEN",
    "ar_quant_max_bytes": "PEERDSL_AR_QUANT_MAX_BYTES",
    "fused_ll_max_bytes": "PEERDSL_FUSED_LL_MAX_BYTES",
    "fused_two_stage_min_bytes": "PEERDSL_FUSED_TWO_STAGE_MIN_BYTES",
    "fused_two_stage_min_hidden": "PEERDSL_FUSED_TWO_STAGE_MIN_HIDDEN",
    "two_stage_min_bytes": "PEERDSL_TWO_STAGE_MIN_BYTES",
    "fused_split_min_bytes": "PEERDSL_FUSED_SPLIT_MIN_BYTES",
}


_FORCED_ENV = "PEERDSL_FUSED_PATH"
_AR_ENV = {"block": "PEERDSL_AR_BLOCK", "unroll": "PEERDSL_AR_UNROLL",
           "end_barrier": "PEERDSL_AR_END_BARRIER"}
_FUSED_ENV = {"U": "PEERDSL_FUSED_UNROLL", "V": "PEERDSL_FUSED_ROWS",
              "E": "PEERDSL_FUSED_END_BARRIER", "S": "PEERDSL_FUSED_SPLIT"}
_ROWS_ENV = "PEERDSL_FUSED_1STAGE_ROWS"  # V of the fused one-stage kernel (kernel_variants)
_ENV_NAMES = (*_ENV.values(), _FORCED_ENV, *_AR_ENV.values(), *_FUSED_ENV.values(),
              _ROWS_ENV)
# os.environ's own storage and its keys in that storage's form: one C-level dict lookup per
# variable instead of os.environ.get's encode + Mapping.get (~1 us each, 7 per plan)
_ENV_KEYS = tuple(map(os.environ.encodekey, _ENV_NAMES)) if hasattr(
    os.environ, "encodekey") else ()


def _env_key() -> tuple:
    """The PEERDSL_* variables dispatch reads, as a cache key (raw values, unparsed)."""
    data = getattr(os.environ, "_data", None)
    if _ENV_KEYS and type(data) is dict:
        return tuple(map(data.get, _ENV_KEYS))
    return tuple(map(os.environ.get, _ENV_NAMES))


def _cached(cache: dict[tuple, Any], key: tuple, make: Callable[[], Any]) -> Any:
    """Plans and tables are cached on all their inputs, the environment included, so a
    change of PEERDSL_* still applies at once while a hot-path call costs one lookup."""
    hit = cache.get(key)
    if hit is None:
        hit = make()  # may raise: errors are never cached
        if len(cache) >= 4096:  # e.g. many distinct row counts: start over, stay bounded
            cache.clear()
        cache[key] = hit
    return hit


def thresholds(arch: str, capacity: dict[str, int] | None = None) -> Thresholds:
    """The arch's table with the PEERDSL_* overrides applied, then capped by `capacity`
    (what a communicator actually allocated: ll_max_bytes, staging_bytes,
    custom_ar_max_bytes), so no setting can send more bytes than a buffer holds."""
    cap = tuple(capacity.items()) if capacity else ()
    return _cached(_CACHE, (arch, _env_key(), cap), lambda: _thresholds(arch, capacity))


def _thresholds(arch: str, capacity: dict[str, int] | None) -> Thresholds:
    t = _with_env(arch)
    if capacity:
        t = dataclasses.replace(t, **{k: min(getattr(t, k), int(v))
                                      for k, v in capacity.items()})
        if "ll_max_bytes" in capacity:
            scratch = int(capacity["ll_max_bytes"])
            t = dataclasses.replace(t, ll_max_bytes_by_world=tuple(
                (w, min(b, scratch)) for w, b in t.ll_max_bytes_by_world))
    return t


_CACHE: dict[tuple, Any] = {}
_FUSED_PLANS: dict[tuple, Any] = {}
_AR_PLANS: dict[tuple, Any] = {}


def _with_env(arch: str) -> Thresholds:
    if arch not in TABLES:
        raise ValueError(f"no dispatch table for arch {arch!r}; known: {sorted(TABLES)}")
    values = _env_ints(_ENV)
    for field, value in values.items():
        if value < 0:
            raise ValueError(f"{_ENV[field]}={os.environ[_ENV[field]]!r} must be >= 0")
    if "ll_max_bytes" in values:  # one LL range for every world, as the variable says
        values["ll_max_bytes_by_world"] = ()
    if "fused_two_stage_min_bytes" in values:  # likewise every hidden size's floor
        values["fused_two_stage_min_bytes_runtime_h"] = ()
    return dataclasses.replace(TABLES[arch], **values)


def _env_ints(names: dict[str, str]) -> dict[str, int]:
    """{field: int value} of the variables of `names` (field -> variable) that are set."""
    values = {}
    for field, name in names.items():
        raw = os.environ.get(name)
        if raw is not None:
            try:
                values[field] = int(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not an integer") from None
    return values


def _dtype_bytes(dtype) -> int:
    key = str(dtype)
    if key not in DTYPE_BYTES:
        raise TypeError(f"dtype {dtype!r} is not supported; use bfloat16 or float16")
    return DTYPE_BYTES[key]


def _check_world(world: int) -> None:
    if not isinstance(world, int) or not 1 <= world <= layout.MAX_RANKS:
        raise ValueError(f"world size {world!r} is not supported; it must be in "
                         f"[1, {layout.MAX_RANKS}]")


def _staging_fits(t: Thresholds, world: int, packs_per_row: int, nbytes: int) -> bool:
    """Each rank stages its 1/world share; the shards must split the packs evenly."""
    return nbytes // world <= t.staging_bytes and packs_per_row % world == 0


def two_stage_fits(t: Thresholds, world: int, hidden: int, nbytes: int,
                   min_hidden: int | None = None) -> bool:
    """`min_hidden`: the fused entry's own bound where a target sets one (None: the
    all-reduce's two_stage_min_hidden)."""
    least = t.two_stage_min_hidden if min_hidden is None else min_hidden
    return (world >= t.two_stage_min_world and hidden >= least
            and _staging_fits(t, world, hidden // 8, nbytes))


def plan_fused_ar_rms(arch: str, world: int, rows: int, hidden: int, dtype,
                      fp8_out: bool = False, contiguous: bool = True,
                      quant: str = "per_token", capacity: dict[str, int] | None = None) -> str:
    """The path of fused all-reduce + add + RMSNorm, per SPEC section 5 (first match)."""
    _check_world(world)  # type-strict, so not left to the cache key's equality
    key = (arch, world, rows, hidden, dtype, fp8_out, contiguous, quant,
           tuple(capacity.items()) if capacity else (), _env_key())
    return _cached(_FUSED_PLANS, key, lambda: _plan_fused_ar_rms(
        arch, world, rows, hidden, dtype, fp8_out, contiguous, quant, capacity))


def _plan_fused_ar_rms(arch: str, world: int, rows: int, hidden: int, dtype, fp8_out: bool,
                       contiguous: bool, quant: str, capacity: dict[str, int] | None) -> str:
    _check_world(world)
    t = thresholds(arch, capacity)
    nbytes = rows * hidden * _dtype_bytes(dtype)
    forced = os.environ.get(_FORCED_ENV)
    if world == 1:
        plan = "local"
    elif not contiguous or nbytes % 16 != 0 or hidden % 8 != 0:
        plan = "unfused"
    elif fp8_out and quant not in t.fused_quant_forms:
        plan = "unfused"
    elif nbytes > t.custom_ar_max_bytes:
        plan = "fallback"
    elif nbytes <= t.fused_ll_cap(world):
        plan = "ll+rmsnorm"
    elif nbytes >= t.fused_two_stage_floor(world, hidden) and two_stage_fits(
            t, world, hidden, nbytes, t.fused_two_stage_min_hidden):
        plan = "fused_2stage"
    elif (t.fused_split_min_bytes is not None and world < t.two_stage_min_world
          and nbytes >= t.fused_split_min_bytes and _splits(arch, world, hidden)
          and two_stage_fits(dataclasses.replace(t, two_stage_min_world=world), world, hidden,
                             nbytes, t.fused_two_stage_min_hidden)):
        plan = "fused_2stage"
    else:
        plan = "fused_1stage"
    if forced:
        return _check_forced(forced, plan, t, world, hidden, nbytes, contiguous)
    return plan


def _splits(arch: str, world: int, hidden: int) -> bool:
    """Whether the fused two-stage kernel would run split for `hidden` (PEERDSL_FUSED_SPLIT
    decides where set): the below-two_stage_min_world route exists only for it."""
    forced = _env_ints({"S": _FUSED_ENV["S"]}).get("S")
    if forced is not None:
        return bool(forced)
    size, runtime_h = kernel_size(hidden)
    return size is not None and fused_2stage_splits(arch, world, size, runtime_h)


def _check_forced(forced: str, plan: str, t: Thresholds, world: int, hidden: int,
                  nbytes: int, contiguous: bool) -> str:
    if forced not in PATHS:
        raise ValueError(f"PEERDSL_FUSED_PATH={forced!r} is not one of {PATHS}")
    why = None
    if plan == "local" and forced != "local":
        why = "world size is 1"
    elif forced == "local" and plan != "local":
        why = f"world size is {world}, not 1"
    elif forced in ("ll+rmsnorm", "fused_1stage", "fused_2stage"):
        if not contiguous or nbytes % 16 or hidden % 8:
            why = "the input is not contiguous 16-byte rows"
        elif nbytes > t.custom_ar_max_bytes:
            why = f"{nbytes} bytes exceed the custom all-reduce cap {t.custom_ar_max_bytes}"
        elif forced == "ll+rmsnorm" and nbytes > t.ll_cap(world):
            why = f"{nbytes} bytes exceed the LL cap {t.ll_cap(world)} at world size {world}"
        elif forced == "fused_2stage" and not _staging_fits(t, world, hidden // 8, nbytes):
            why = (f"two-stage needs bytes/world <= {t.staging_bytes} and hidden/8 divisible by "
                   f"world ({nbytes} bytes, hidden {hidden}, world {world})")
    if why:
        raise ValueError(f"PEERDSL_FUSED_PATH={forced!r} cannot run here: {why}")
    return forced


def fp8_in_epilogue(arch: str, rows: int, hidden: int, dtype) -> bool:
    """FP8 fused into the epilogue up to PEERDSL_AR_QUANT_MAX_BYTES, else a quant kernel after."""
    return rows * hidden * _dtype_bytes(dtype) <= thresholds(arch).ar_quant_max_bytes


def plan_all_reduce(arch: str, world: int, nbytes: int, contiguous: bool = True,
                    capacity: dict[str, int] | None = None) -> str:
    """The path of a plain all-reduce of nbytes: local, fallback, ll, 1stage or 2stage."""
    _check_world(world)
    key = (arch, world, nbytes, contiguous, tuple(capacity.items()) if capacity else (),
           _env_key())
    return _cached(_AR_PLANS, key, lambda: _plan_all_reduce(arch, world, nbytes, contiguous,
                                                         capacity))


def _plan_all_reduce(arch: str, world: int, nbytes: int, contiguous: bool,
                     capacity: dict[str, int] | None) -> str:
    _check_world(world)
    t = thresholds(arch, capacity)
    if world == 1:
        return "local"
    if fallback_reason(t, nbytes, contiguous):
        return "fallback"
    if nbytes <= t.ll_cap(world):
        return "ll"
    if (world >= t.two_stage_min_world and nbytes >= t.two_stage_min_bytes
            and _staging_fits(t, world, nbytes // 16, nbytes)):
        return "2stage"
    return "1stage"


def fallback_reason(t: Thresholds, nbytes: int, contiguous: bool) -> str | None:
    """Why a plain all-reduce of nbytes takes the library fallback under thresholds `t`,
    in words (None: the custom path serves it)."""
    if not contiguous:
        return "a non-contiguous input"
    if nbytes % 16:
        return f"{nbytes} bytes, not a multiple of 16"
    if nbytes > t.custom_ar_max_bytes:
        return f"{nbytes} bytes, over the custom path's {t.custom_ar_max_bytes}"
    return None


def check_qk_norm(arch: str) -> None:
    """Fused qk-norm all-reduce entry points are not supported on gfx1250 (SPEC section 5)."""
    if not thresholds(arch).qk_norm_fused:
        raise NotImplementedError(
            f"fused qk-norm all-reduce is not available on {arch}: the fused kernels synchronize "
            "only through the gfx1250 Signal protocol and no qk-norm kernel is written against "
            "it yet; call all_reduce() followed by the norm instead")


# the kernel-variant tables and choices (runtime/kernel_variants.py), re-exported
from .kernel_variants import (AR_KERNELS, FUSED_1STAGE_ROWS, FUSED_2STAGE,  # noqa: E402
                              UNROLLS, ArKernel, ar_kernel, fused_1stage_rows,
                              fused_2stage_kernel, fused_2stage_splits)
