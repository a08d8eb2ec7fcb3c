"""What a communicator can launch: the world and hidden sizes its kernels were built for.

On a GPU the manifest says (one entry per kernel variant, with its constexprs); on the
simulator the op registry's variants for the target do (what `peerdsl build` would compile).
The world is checked when a communicator (or a simulator job) is made and the hidden size
before any launch, so an unbuilt size fails at once, naming the sizes that are built and how
to build others, instead of in the manifest lookup of the first launch.

Hidden sizes: every row kernel has a specialized variant (constexpr H, built for the common
sizes, ops/_row_slots.py SUPPORTED_HIDDEN) and a runtime-H one (`<op>_runtime_h`: the size is a
kernel argument, `hidden`, up to its constexpr bound MAXH, ops/_row_slots.py RUNTIME_MAXH; the
same bytes). A launch takes the specialized variant when it is built for H, else the
runtime-H variant of the smallest bound >= H (`row_kernel`), so any multiple of 8 in
[256, 16384] is served by a full build.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

from ..ops._rows import HIDDEN_MAX, HIDDEN_MIN, NORM_BLOCK, hidden_rule_error, runtime_class

# the row kernels' runtime-H variants (op -> its runtime-H op)
RUNTIME_H_OPS = {op: f"{op}_runtime_h" for op in (
    "add_rmsnorm", "per_token_quant_fp8", "fused_ar_rms_1stage", "fused_ar_rms_2stage",
    "fused_ar_rms_gather")}
# the fused one-stage kernel with V rows per block iteration (runtime/fused_launch.py); not
# in COLLECTIVE_OPS: it is built for some world sizes only, the plain kernel serves the rest
ROWS_OP = "fused_ar_rms_1stage_rows"
# the ll+rmsnorm path in one launch (runtime/fused_launch.py `fused_ll`), where it is built
FUSED_LL_OP = "fused_ar_rms_ll"
# every specialized norm-family kernel: one thread mapping (B) per hidden size across them
NORM_OPS = (*RUNTIME_H_OPS, ROWS_OP, FUSED_LL_OP)
# the kernels behind the collective methods of runtime/collectives.py (W constexpr)
COLLECTIVE_OPS = ("allreduce_ll", "allreduce_1stage", "allreduce_2stage", "allgather",
                  "null_collective", "fused_ar_rms_1stage", "fused_ar_rms_2stage",
                  "fused_ar_rms_1stage_runtime_h", "fused_ar_rms_2stage_runtime_h")
# the kernels an entry point may launch for a hidden size H (every path it can take)
HIDDEN_OPS = {
    "add_rmsnorm": ("add_rmsnorm",),
    "per_token_quant_fp8": ("per_token_quant_fp8",),
    "fused_allreduce_rmsnorm": ("add_rmsnorm", "fused_ar_rms_1stage"),
}
WORLDS_SOURCE = "peerdsl/ops/_collective.py WORLDS"
HIDDEN_SOURCE = "peerdsl/ops/_row_slots.py SUPPORTED_HIDDEN"
RUNTIME_SOURCE = "peerdsl/ops/_row_slots.py RUNTIME_MAXH"


@dataclasses.dataclass(frozen=True)
class RowKernel:
    """The variant a row op launches for a hidden size: `name` with the size constexpr
    `size_key` = `size` ("H" = hidden, or the runtime-H bound "MAXH"), plus `args` (the
    runtime-H kernels' `hidden`; empty for specialized ones). `block`: the threads that
    share a row (constexpr B, ops/_row_slots.py `norm_block`) as built for that size, None
    where the build does not name it."""
    name: str
    size_key: str
    size: int
    args: Mapping[str, int]
    block: int | None = None

    @property
    def runtime_h(self) -> bool:
        return self.size_key == "MAXH"

    @property
    def constexprs(self) -> dict[str, int]:
        """The constexprs that pick this variant's size and thread mapping."""
        cx = {self.size_key: self.size}
        if self.block is not None:
            cx["B"] = self.block
        return cx


@dataclasses.dataclass(frozen=True)
class Built:
    arch: str
    source: str                                   # where the facts come from (messages)
    variants: Mapping[str, tuple[Mapping[str, Any], ...]]  # op -> constexprs of each variant
    build_hint: str                               # how to build more
    # row_kernel's answers (per op, hidden size, forced): the launch path asks every call
    _row_kernels: dict = dataclasses.field(default_factory=dict, init=False, repr=False,
                                           compare=False)

    def values(self, op: str, key: str) -> tuple[int, ...]:
        return tuple(sorted({int(c[key]) for c in self.variants.get(op, ()) if key in c}))

    def has(self, op: str, **constexprs: int) -> bool:
        """Whether a variant of `op` with these (integer) constexprs is built."""
        return any(all(k in c and int(c[k]) == v for k, v in constexprs.items())
                   for c in self.variants.get(op, ()))

    def worlds(self) -> tuple[int, ...]:
        """World sizes every collective kernel present was built for (() if none is)."""
        sets = [set(self.values(op, "W")) for op in COLLECTIVE_OPS if op in self.variants]
        return tuple(sorted(set.intersection(*sets))) if sets else ()

    def hidden(self, entry: str) -> tuple[int, ...]:
        """Hidden sizes every kernel that `entry` may launch has a specialized variant for."""
        sets = [set(self.values(op, "H")) for op in HIDDEN_OPS[entry]]
        return tuple(sorted(set.intersection(*sets)))

    def runtime_hidden_max(self, entry: str) -> int:
        """The largest hidden size every kernel that `entry` may launch has a runtime-H
        variant for (0 if one of them has none)."""
        return min(max(self.values(RUNTIME_H_OPS[op], "MAXH"), default=0)
                   for op in HIDDEN_OPS[entry])

    def row_kernel(self, op: str, hidden: int, force_runtime_h: bool = False) -> RowKernel:
        """What row op `op` launches for `hidden`: its specialized variant when built for
        it (unless `force_runtime_h`), else its runtime-H variant of the smallest bound that
        covers it. Same answer on every rank of one build, so every rank launches the same
        kernel. Raises ValueError when neither is built."""
        key = (op, hidden, force_runtime_h)
        hit = self._row_kernels.get(key)
        if hit is None:
            hit = self._row_kernels[key] = self._choose_row_kernel(op, hidden, force_runtime_h)
        return hit

    def _choose_row_kernel(self, op: str, hidden: int, force_runtime_h: bool) -> RowKernel:
        if not force_runtime_h and hidden in self.values(op, "H"):
            return RowKernel(op, "H", hidden, {}, self._block(op, "H", hidden))
        rt = RUNTIME_H_OPS[op]
        bound = runtime_class(hidden, self.values(rt, "MAXH"))
        if bound is not None and hidden_rule_error(hidden) is None:
            return RowKernel(rt, "MAXH", bound, {"hidden": hidden}, self._block(rt, "MAXH", bound))
        why = (f"no runtime-H variant ({rt}) with MAXH >= {hidden} is built"
               + (" and the specialized one was not asked for" if force_runtime_h else
                  f", nor {op} for H={hidden}"))
        raise ValueError(f"hidden size {hidden} is not built for {op} on {self.arch}: {why} "
                         f"({self.source}); {self.build_hint}")

    def _block(self, op: str, size_key: str, size: int) -> int | None:
        """The B that `op`'s variants of this size are built with (None: not named, as in
        a build from before B, whose kernels all ran NORM_BLOCK threads a row). Every norm
        kernel of one size must share it, so that all of them normalize a row alike (fused
        == unfused); a build that mixes two, in one op or across them (a partial rebuild
        merged into an older manifest), is refused rather than launched."""
        family = NORM_OPS if size_key == "H" else tuple(RUNTIME_H_OPS.values())
        sized = {o: [c for c in self.variants.get(o, ())
                     if size_key in c and int(c[size_key]) == size] for o in {*family, op}}
        blocks = {o: {int(c.get("B", NORM_BLOCK)) for c in cs} for o, cs in sized.items()}
        if len(set().union(*blocks.values())) > 1:
            which = ", ".join(f"{o} B={sorted(b)}" for o, b in sorted(blocks.items()) if b)
            raise ValueError(f"the norm kernels for {size_key}={size} are built with several "
                             f"thread mappings ({which}; {self.source}): their rows would not "
                             f"normalize alike; {self.build_hint}")
        named = [int(c["B"]) for c in sized[op] if "B" in c]
        return named[0] if named else None

    def check_world(self, world: int) -> None:
        if world == 1:  # every call takes a local path: no collective kernel
            return
        built = self.worlds()
        if not built:  # a build of user ops only: their launches name missing variants
            return
        if world not in built:
            raise ValueError(
                f"world size {world} is not built for {self.arch}: collective kernels are "
                f"built for world sizes {list(built)} ({self.source}). "
                f"Use one of those, or add {world} to {WORLDS_SOURCE} and {self.build_hint}")

    def check_hidden(self, hidden: int, entry: str) -> None:
        """`hidden` is a multiple of 8 in [256, 16384] and every kernel `entry` may launch
        has a variant for it (specialized for it, or a runtime-H one that covers it)."""
        why = hidden_rule_error(hidden, entry)
        if why is not None:
            raise ValueError(why)
        built = self.hidden(entry)
        if hidden in built or hidden <= self.runtime_hidden_max(entry):
            return
        top = self.runtime_hidden_max(entry)
        runtime = (f"runtime-H variants up to {top}" if top else "no runtime-H variants")
        raise ValueError(
            f"hidden size {hidden} is not built for {entry} on {self.arch}: specialized hidden "
            f"sizes {list(built)} and {runtime} ({self.source}). Use one of those, or "
            f"{self.build_hint} (a full build serves every multiple of 8 in "
            f"[{HIDDEN_MIN}, {HIDDEN_MAX}]: {RUNTIME_SOURCE}); to specialize {hidden}, add it "
            f"to {HIDDEN_SOURCE}")


def from_manifest(manifest: Any, build_dir: str = "build") -> Built:
    """From a loaded manifest (runtime/manifest.py Manifest: .arch, .path, .kernels with
    .op and .constexprs per entry)."""
    variants: dict[str, list] = {}
    for entry in manifest.kernels.values():
        variants.setdefault(entry.op, []).append(entry.constexprs)
    arch = getattr(manifest, "arch", "?")
    return Built(arch, f"manifest {getattr(manifest, 'path', '?')}",
                 {op: tuple(v) for op, v in variants.items()},
                 f"rebuild: `peerdsl build --arch {arch} --ops all -o {build_dir}`")


@functools.lru_cache(maxsize=None)
def from_registry(target: str) -> Built:
    """What `peerdsl build` would build for `target` (the simulator has no manifest)."""
    from ..lowering.targets import get_target  # pure data: no MLIR
    from ..ops.registry import load_all
    t = get_target(target)
    # RUNTIME_H_OPS's keys too: the gather kernel (NVIDIA only) is in no HIDDEN_OPS entry
    wanted = set(COLLECTIVE_OPS).union(*HIDDEN_OPS.values(), RUNTIME_H_OPS,
                                       RUNTIME_H_OPS.values(), (ROWS_OP, FUSED_LL_OP))
    variants = {name: tuple(spec.variants(t)) for name, spec in load_all().items()
                if name in wanted}
    return Built(target, "simulator: the op registry's variants", variants,
                 "rerun (the simulator traces kernels when they are launched)")

