"""Which kernels the ahead-of-time build compiles, and with which specializations.

Each op file registers its kernel with a function that, given a target's facts (a
`peerdsl.lowering.targets.Target`, pure data), lists the constexpr sets to build for it.
User code does the same through `peerdsl.register_op` (this module's `register`), and
`peerdsl build --module FILE_OR_MODULE` imports such modules (`import_module`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from typing import Any, Callable, Mapping, Sequence

from ..dsl.kernel import Kernel

Variants = Callable[[Any], list[dict[str, Any]]]
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class RegistryError(ValueError):
    """An op cannot be registered or a user module cannot be imported (the message says why)."""


@dataclasses.dataclass(frozen=True)
class OpSpec:
    name: str
    kernel: Kernel
    variants: Variants
    registered_by: str = ""   # module that called register (provenance in the manifest)


REGISTRY: dict[str, OpSpec] = {}
_IMPORTED: dict[str, str] = {}  # user module path -> sha256 of the source it was imported from


def _source_of(kernel: Kernel) -> tuple[str, str]:
    code = kernel.fn.__code__
    return os.path.abspath(code.co_filename), kernel.fn.__qualname__


def _as_variants(name: str, variants: "Variants | Sequence[Mapping[str, Any]]") -> Variants:
    if callable(variants):
        return variants
    if isinstance(variants, (list, tuple)):
        bad = [v for v in variants if not isinstance(v, Mapping)]
        if bad:
            raise RegistryError(f"op {name!r}: variants must be dicts of constexprs, got "
                                f"{type(bad[0]).__name__} {bad[0]!r}")
        fixed = [dict(v) for v in variants]
        return lambda target: [dict(v) for v in fixed]
    raise RegistryError(f"op {name!r}: variants must be a list of constexpr dicts or a "
                        f"callable(target) -> list of dicts, got {type(variants).__name__}")


def register(name: str, kernel: Kernel,
             variants: "Variants | Sequence[Mapping[str, Any]]") -> OpSpec:
    """Register `kernel` as op `name`, built once per constexpr dict of `variants` (a list,
    or a callable given the target's facts: `variants(target) -> list of dicts`).

    Registering the same name again from the same source (a module imported twice) replaces
    the entry; a different kernel under a taken name is an error.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise RegistryError(f"op name {name!r} must be an identifier (letters, digits, _)")
    if not isinstance(kernel, Kernel):
        raise RegistryError(f"op {name!r}: expected a @dsl.kernel function, got "
                            f"{type(kernel).__name__}")
    old = REGISTRY.get(name)
    if old is not None and _source_of(old.kernel) != _source_of(kernel):
        f_old, q_old = _source_of(old.kernel)
        f_new, q_new = _source_of(kernel)
        raise RegistryError(f"op {name!r} registered twice: kernel {q_old} ({f_old}) and "
                            f"kernel {q_new} ({f_new}); give one of them another name")
    caller = sys._getframe(1).f_globals.get("__name__", "")
    spec = OpSpec(name, kernel, _as_variants(name, variants), caller)
    REGISTRY[name] = spec
    return spec


def load_all() -> dict[str, OpSpec]:
    """Import every op module (they register themselves) and return the registry."""
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
            raise RegistryError(f"unknown ops {unknown}; known: {sorted(reg)} (a user op is "
                                "known once its module is imported: --module FILE_OR_MODULE)")
    items = []
    for name in sorted(set(names) if names is not None else reg):
        spec = reg[name]
        try:
            variants = spec.variants(target)
        except Exception as e:
            raise RegistryError(f"op {name!r}: its variants({target.arch}) raised "
                                f"{type(e).__name__}: {e} ({user_frame(e)})") from e
        if not isinstance(variants, (list, tuple)) or not all(isinstance(v, Mapping)
                                                              for v in variants):
            raise RegistryError(f"op {name!r}: variants({target.arch}) must return a list of "
                                f"constexpr dicts, got {variants!r}")
        for constexprs in variants:
            items.append((name, spec.kernel, dict(constexprs)))
    return items


# ----------------------------------------------------------------------------- user modules

def user_frame(e: BaseException) -> str:
    """file:line of the innermost frame of e's traceback outside peerdsl (the user's code)."""
    if isinstance(e, SyntaxError) and e.filename:
        return f"{e.filename}:{e.lineno}"
    frames = traceback.extract_tb(e.__traceback__)
    user = [f for f in frames if not f.filename.startswith(_PKG_DIR + os.sep)
            and not f.filename.startswith("<frozen")]
    f = (user or frames or [None])[-1]
    return f"{f.filename}:{f.lineno}" if f else "<unknown>"


def _module_name_for(path: str) -> str:
    stem = os.path.splitext(os.path.basename(path))[0]
    mod = sys.modules.get(stem)
    if mod is None or os.path.abspath(getattr(mod, "__file__", "") or "") == path:
        return stem
    return f"{stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def import_module(spec: str) -> Any:
    """Import a user module given as a .py path or a dotted module name (its ops register
    themselves). A module already imported from the same file is not executed again."""
    looks_like_path = spec.endswith(".py") or os.sep in spec or os.path.isfile(spec)
    if not looks_like_path:
        try:
            return importlib.import_module(spec)
        except ModuleNotFoundError as e:
            if e.name and spec.startswith(e.name):
                raise RegistryError(f"--module {spec}: no module named {e.name!r} (give a .py "
                                    "path or a dotted name importable from sys.path)") from e
            raise RegistryError(f"--module {spec}: importing it failed: {e} "
                                f"({user_frame(e)})") from e
        except Exception as e:
            raise RegistryError(f"--module {spec}: importing it failed: {type(e).__name__}: "
                                f"{e} ({user_frame(e)})") from e
    path = os.path.abspath(spec)
    if not os.path.isfile(path):
        raise RegistryError(f"--module {spec}: no such file {path}")
    name = _module_name_for(path)
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    if name in sys.modules and _IMPORTED.get(path) == sha:
        return sys.modules[name]  # unchanged since it was imported: its ops are registered
    mspec = importlib.util.spec_from_file_location(name, path)
    if mspec is None or mspec.loader is None:
        raise RegistryError(f"--module {spec}: {path} is not a Python module")
    module = importlib.util.module_from_spec(mspec)
    previous = sys.modules.get(name)
    sys.modules[name] = module
    before = dict(REGISTRY)
    sys.path.insert(0, os.path.dirname(path))  # its sibling imports, as `python FILE` has them
    try:
        mspec.loader.exec_module(module)
    except Exception as e:
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
        REGISTRY.clear()  # a half-imported module registers nothing
        REGISTRY.update(before)
        raise RegistryError(f"--module {spec}: importing it failed: {type(e).__name__}: {e} "
                            f"({user_frame(e)})") from e
    finally:
        sys.path.remove(os.path.dirname(path))
    _IMPORTED[path] = sha
    return module
