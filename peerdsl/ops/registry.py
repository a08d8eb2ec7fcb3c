"""Which kernels the ahead-of-time build compiles, and with which specializations.

Each op file registers its kernel with a function that, given a target's facts (a
`peerdsl.lowering.targets.Target`, pure data), lists the constexpr sets to build for it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from ..dsl.kernel import Kernel


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    kernel: Kernel
    variants: Callable[[Any], list[dict[str, Any]]]


REGISTRY: dict[str, OpSpec] = {}


def register(name: str, kernel: Kernel, variants: Callable[[Any], list[dict[str, Any]]]) -> None:
    if name in REGISTRY and REGISTRY[name].kernel is not kernel:
        raise ValueError(f"op {name!r} registered twice")
    REGISTRY[name] = OpSpec(name, kernel, variants)


def load_all() -> dict[str, OpSpec]:
    """Import every op module (they register themselves) and return the registry."""
    import importlib
    import pkgutil

    from .. import ops
    for mod in pkgutil.iter_modules(ops.__path__):
        if mod.name not in ("registry",) and not mod.name.startswith("_"):
            importlib.import_module(f"{ops.__name__}.{mod.name}")
    return REGISTRY


def build_items(target: Any, names: list[str] | None = None) -> list[tuple[str, Kernel, dict]]:
    """(op name, kernel, constexprs) for every variant of the named ops (all when None)."""
    reg = load_all()
    if names is not None:
        unknown = sorted(set(names) - set(reg))
        if unknown:
            raise KeyError(f"unknown ops {unknown}; known: {sorted(reg)}")
    items = []
    for name in sorted(names if names is not None else reg):
        spec = reg[name]
        for constexprs in spec.variants(target):
            items.append((name, spec.kernel, dict(constexprs)))
    return items
