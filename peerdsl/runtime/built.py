"""What a communicator can launch: the world and hidden sizes its kernels were built for.

On a GPU the manifest says (one entry per kernel variant, with its constexprs); on the
simulator the op registry's variants for the target do (what `peerdsl build` would compile).
The world is checked when a communicator (or a simulator job) is made and the hidden size
before any launch, so an unbuilt size fails at once, naming the sizes that are built and how
to build others, instead of in the manifest lookup of the first launch.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

# the kernels behind the collective methods of runtime/collectives.py (W constexpr)
COLLECTIVE_OPS = ("allreduce_ll", "allreduce_1stage", "allreduce_2stage", "allgather",
                  "null_collective", "fused_ar_rms_1stage", "fused_ar_rms_2stage")
# the kernels an entry point may launch for a hidden size H (every path it can take)
HIDDEN_OPS = {
    "add_rmsnorm": ("add_rmsnorm",),
    "per_token_quant_fp8": ("per_token_quant_fp8",),
    "fused_allreduce_rmsnorm": ("add_rmsnorm", "fused_ar_rms_1stage"),
}
WORLDS_SOURCE = "peerdsl/ops/_collective.py WORLDS"
HIDDEN_SOURCE = "peerdsl/ops/_rows.py SUPPORTED_HIDDEN"


@dataclasses.dataclass(frozen=True)
class Built:
    arch: str
    source: str                                   # where the facts come from (messages)
    variants: Mapping[str, tuple[Mapping[str, Any], ...]]  # op -> constexprs of each variant
    build_hint: str                               # how to build more

    def values(self, op: str, key: str) -> tuple[int, ...]:
        return tuple(sorted({int(c[key]) for c in self.variants.get(op, ()) if key in c}))

    def worlds(self) -> tuple[int, ...]:
        """World sizes every collective kernel present was built for (() if none is)."""
        sets = [set(self.values(op, "W")) for op in COLLECTIVE_OPS if op in self.variants]
        return tuple(sorted(set.intersection(*sets))) if sets else ()

    def hidden(self, entry: str) -> tuple[int, ...]:
        """Hidden sizes every kernel that `entry` may launch was built for."""
        sets = [set(self.values(op, "H")) for op in HIDDEN_OPS[entry]]
        return tuple(sorted(set.intersection(*sets)))

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
        built = self.hidden(entry)
        if hidden not in built:
            raise ValueError(
                f"hidden size {hidden} is not built for {entry} on {self.arch}: built hidden "
                f"sizes {list(built)} ({self.source}). Use one of those, or add {hidden} to "
                f"{HIDDEN_SOURCE} and {self.build_hint}")


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
    wanted = set(COLLECTIVE_OPS).union(*HIDDEN_OPS.values())
    variants = {name: tuple(spec.variants(t)) for name, spec in load_all().items()
                if name in wanted}
    return Built(target, "simulator: the op registry's variants", variants,
                 "rerun (the simulator traces kernels when they are launched)")

