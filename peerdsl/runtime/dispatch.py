"""Which path a collective takes (SPEC section 5). Pure functions: no device, no MLIR.

gfx1250 defaults are the SPEC's table; gfx950 and gfx942 keep it until measured. sm_90 has
its own LL cap: on the lent H200 (ranks sharing one GPU's HBM, benchmarks/RESULTS.md) the LL
all-reduce, which moves four times the bytes of the one-stage kernel, cost 13 us at 16 rows
and 46 us at 64 rows (TP4, H=6144) while the two-stage kernel took 43 us at 384 rows, so LL
only pays below about 128 KiB there; at TP2 up to 320 KiB (call N6, 2026-12-07, H100: there
the LL kernel beat the one-stage one, whose end barrier pays SPEC section 3's release, up to
288 KiB). For the fused entry the one-stage kernel beat LL + add +
RMSNorm at every row count measured (1 to 256 rows, TP2 and TP4, H 2880/6144/8192: e.g. TP4
H=6144 one row 10.5 vs 12.3 us), so sm_90's fused LL range is empty; and the one-stage fused
kernel beat the two-stage one up to 256 rows at TP4 (H=6144: 9.5 vs 11.7 us at 16 rows, 29.5
vs 32.9 at 256; H=8192 likewise), and on 2026-12-03 it also won from 384 to 4096 rows in two
runs (TP4 H=6144: 40.1 vs 44.1 us at 384 rows, 87.9 vs 97.9 at 1024, 311.7 vs 342.3 at 4096).
Then the two-stage kernel got its sm_90 schedules (runtime/kernel_variants.py
`FUSED_2STAGE`: more shard packs and rows in flight), and in call F1 it won at TP4 from
2 MiB (H 2880/6144/8192), so sm_90's fused entry took it from there, H = 2880 included
(`fused_two_stage_min_hidden`). Call L3 (2026-12-06, TP4, twice interleaved) moved that to
768 KiB: with V = 1 row in flight up to 256 rows (runtime/kernel_variants.py) it beat the
one-stage kernel at 64-256 rows (H = 6144 64 rows 10.9 / 12.5 us against 13.4 / 12.6, 128
rows 14.0 / 14.0 against 17.8 / 17.7; H = 2880 256 rows 17.9 / 17.1 against 19.4 / 20.0).
At some hidden sizes its schedule is split (stage 1, then a gather launch of its own grid:
`FUSED_2STAGE` split_hidden), which in call G4 also won at TP2 from 1024 rows (H = 2880), so
there the fused entry takes it from 4 MiB (`fused_split_min_bytes`). Every threshold has a
`PEERDSL_*` environment override, read at each call.

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

MiB = 1 << 20
PATHS = ("local", "unfused", "fallback", "ll+rmsnorm", "fused_1stage", "fused_2stage")
AR_PATHS = ("local", "fallback", "ll", "1stage", "2stage")
DTYPE_BYTES = {"bf16": 2, "f16": 2, "bfloat16": 2, "float16": 2, "torch.bfloat16": 2,
               "torch.float16": 2}


@dataclasses.dataclass(frozen=True)
class Thresholds:
    ll_max_bytes: int = 4 * MiB
    custom_ar_max_bytes: int = 64 * MiB
    staging_bytes: int = 16 * MiB
    two_stage_min_world: int = 4
    two_stage_min_hidden: int = 6144
    ar_quant_max_bytes: int = 64 * MiB
    fused_quant_forms: tuple[str, ...] = ("per_token",)  # others take the unfused path
    qk_norm_fused: bool = False
    # the fused entry's LL range (None: ll_max_bytes, as in SPEC section 5); a target where
    # the one-stage fused kernel beats LL + add + RMSNorm sets its own
    fused_ll_max_bytes: int | None = None
    fused_two_stage_min_bytes: int = 0  # below it the fused entry takes the one-stage kernel
    fused_two_stage_min_hidden: int | None = None  # None: two_stage_min_hidden
    two_stage_min_bytes: int = 0  # below it the plain all-reduce takes the one-stage kernel
    # below two_stage_min_world: the fused entry takes the two-stage kernel from these bytes
    # where its schedule splits (FUSED_2STAGE split_hidden); None: never
    fused_split_min_bytes: int | None = None
    # (world, bytes): the plain all-reduce's LL range for that world size in place of
    # ll_max_bytes (PEERDSL_LL_MAX_BYTES, where set, is every world's); never past the
    # scratch a communicator allocated
    ll_max_bytes_by_world: tuple[tuple[int, int], ...] = ()
    # (world, runtime-H bound MAXH, bytes): the fused entry's two-stage floor at a hidden
    # size the runtime-H kernels serve, in place of fused_two_stage_min_bytes
    # (PEERDSL_FUSED_TWO_STAGE_MIN_BYTES, where set, is every size's)
    fused_two_stage_min_bytes_runtime_h: tuple[tuple[int, int, int], ...] = ()

    def ll_cap(self, world: int) -> int:
        """The plain all-reduce's LL range at `world` ranks."""
        return dict(self.ll_max_bytes_by_world).get(world, self.ll_max_bytes)

    def fused_ll_cap(self, world: int) -> int:
        """The fused entry's LL range at `world` ranks: never past the plain all-reduce's,
        whose LL kernel its two-launch form runs."""
        if self.fused_ll_max_bytes is None:
            return self.ll_cap(world)
        return min(self.fused_ll_max_bytes, self.ll_cap(world))

    def fused_two_stage_floor(self, world: int, hidden: int) -> int:
        """The fused entry's two-stage floor in bytes for `hidden` at `world` ranks."""
        if self.fused_two_stage_min_bytes_runtime_h:
            bound, runtime_h = kernel_size(hidden)
            if runtime_h:
                for w, maxh, nbytes in self.fused_two_stage_min_bytes_runtime_h:
                    if (w, maxh) == (world, bound):
                        return nbytes
        return self.fused_two_stage_min_bytes


TABLES = {
    "gfx1250": Thresholds(),
    "gfx950": Thresholds(),
    "gfx942": Thresholds(),
    # two_stage_min_bytes: the one-stage all-reduce up to the 64 MiB custom cap. The
    # two-stage kernel won at no row count measured: at TP4, H = 6144 x 4096 rows (48 MiB)
    # the two tied on the H200 (2026-12-03: 144.4 / 142.0 us), and on the H100 of call L6
    # (2026-12-06, twice interleaved) the one-stage kernel took 168.6 / 174.5 against 191.2
    # / 192.0 (vLLM 180-184); at 8192 x 4096 223.2 / 225.1 against 251.9 / 257.2 (vLLM
    # 240-246); 8192 x 2048 tied. So two-stage only past that cap, where nothing was measured
    # fused_two_stage_*: call F1 (2026-12-03, RESULTS.md), TP4, the two-stage kernel with
    # U=4 and V=2 rows (V=1 at 8192) beat the one-stage one from 384 rows at H=2880 (26.9 vs
    # 30.1 us), from 256 rows at 6144 (2048: 146.8 vs 169.2) and at 8192 (256: 36.3 vs
    # 38.2; 4096: 372.0 vs 404.7); with V = 1 up to 256 rows it also wins from 768 KiB
    # (call L3, 2026-12-06: H = 6144 and 8192 from 64 rows, 2880 at 256 rows)
    # ll_max_bytes_by_world: at TP2 the LL kernel (no barrier) beat the one-stage one (its
    # end barrier's release, SPEC section 3) on the mean of two rounds up to 288 KiB and
    # lost from 384 KiB (call N6, 2026-12-07, H100, twice interleaved: 6144 x 16 rows 4.2 /
    # 4.7 us against 4.9 / 5.5, 8192 x 16 4.6 / 4.6 against 5.8 / 5.7, 6144 x 24 5.9 / 5.7
    # against 6.3 / 6.3; 6144 x 32 8.0 / 6.5 against 6.4 / 5.5); TP4 keeps 128 KiB, not
    # re-measured on the H100 between
    # 128 and 768 KiB (call J1, H200: LL 9.4 us at 16 rows, even with the one-stage kernel,
    # and 21.7 at 64 rows against 10.3-11.5); on the H100 (call P2, twice interleaved) LL
    # lost from 135 KiB (6144 x 16 rows 10.6 / 12.1 against 7.3 / 8.6)
    # fused_two_stage_min_bytes_runtime_h: at TP4 the runtime-H one-stage kernel beat the
    # runtime-H two-stage one below these floors (calls N2, P1, P2, 2026-12-07, H100, 2-6
    # samples a cell). MAXH 2048 (H = 2048): 1 MiB one-stage 14.5 us on the mean of six
    # against 16.3 for the split kernel dispatch took; 1.5 MiB split 19.1 against 20.1;
    # 2 MiB split 22.6 / 23.8 against 27.4 / 28.6. MAXH 4096 (3584): 1.75 MiB one-stage 21.9
    # (mean of four) against 22.7; 2.6 MiB split 31.0 / 32.8 against 34.7 / 35.2. MAXH 6144
    # (5120): one-stage ahead at 1.25-5 MiB (2.5 MiB: 27.0-31.5 against 28.4-38.0) and 2%
    # at 10 MiB (86.1 against 87.7, mean of four), two-stage 1% ahead at 20 MiB (157.9
    # against 159.5) and 3% at 40 MiB. MAXH 8192 (7680) keeps 768 KiB: even at 128-256 rows,
    # the two-stage kernel 3-6% ahead from 512 rows, and at 64 rows 14.1 against 15.0.
    # MAXH 12288 (the two-stage kernel split there: kernel_variants split_bounds): with
    # stage 1 at U = 4 (call P4) the split kernel is ahead from 5 MiB (H = 10240 x 1024
    # rows 191.7 against 198.0 for the one-stage kernel in one sweep; 256 rows, 5 MiB, 59.0 /
    # 56.4 against P3's 59.3 / 61.8, the pair 56.4 / 56.5 in both calls; 12288 x 256 rows
    # 63.8 / 64.2 against 68.8 / 67.5); at 1.25-1.5 MiB the one-stage kernel led the U = 0
    # split by 3-10% (P3: 12288 x 64 rows 18.6 / 19.6 against 20.4 / 20.4), not measured
    # against U = 4; MAXH 16384 keeps 768 KiB (the U = 0 split already the fastest path
    # from 64 rows in P3: 26.7 / 28.0 against 29.0 / 29.5; U = 4 ahead of it by 0-3%)
    "sm_90": Thresholds(ll_max_bytes=128 << 10, fused_ll_max_bytes=0,
                        fused_two_stage_min_bytes=768 << 10, fused_two_stage_min_hidden=2048,
                        two_stage_min_bytes=128 * MiB, fused_split_min_bytes=4 * MiB,
                        ll_max_bytes_by_world=((2, 320 << 10),),
                        fused_two_stage_min_bytes_runtime_h=(
                            (4, 2048, 3 * MiB // 2), (4, 4096, 2 * MiB), (4, 6144, 16 * MiB),
                            (4, 12288, 4 * MiB))),
}

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
    if not contiguous or nbytes % 16 or nbytes > t.custom_ar_max_bytes:
        return "fallback"
    if nbytes <= t.ll_cap(world):
        return "ll"
    if (world >= t.two_stage_min_world and nbytes >= t.two_stage_min_bytes
            and _staging_fits(t, world, nbytes // 16, nbytes)):
        return "2stage"
    return "1stage"


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
