"""Content-addressed cache of compiled kernels.

The key is the sha256 of everything that can change the code object: the printed kernel IR
(so editing a helper the kernel calls changes it), the constexprs, the instance symbol,
the target's facts, the compiler versions and the lowering's own source. The cache holds
one directory per key: `code` (HSACO/cubin), `isa` (assembly/PTX) and `meta.json`.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import tempfile
from typing import Any

from ..dsl import ir
from .targets import Target
from .toolchain import cache_dir, compiler_versions


def jsonable(v: Any) -> Any:
    """Constexpr values as JSON: DSL dtypes by name ("bf16"), torch dtypes likewise."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (ir.ScalarType, ir.VectorType)):
        return str(v)
    if type(v).__module__.split(".")[0] == "torch":
        from ..dsl.kernel import dtype_of
        return str(dtype_of(v))
    name = getattr(v, "name", None)
    return name if isinstance(name, str) else str(v)


@functools.lru_cache(maxsize=None)
def lowering_source_hash() -> str:
    """Hash of the lowering's Python source: a change in how we lower invalidates entries."""
    here = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for name in sorted(os.listdir(here)):
        # build.py, cache.py and the API / occupancy arithmetic do not change code objects
        if name.endswith(".py") and name not in ("build.py", "cache.py", "api.py",
                                                 "occupancy.py"):
            with open(os.path.join(here, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def cache_key(kernel: ir.Kernel, symbol: str, target: Target) -> str:
    doc = {"ir": ir.print_kernel(kernel), "constexprs": jsonable(kernel.constexprs),
           "symbol": symbol, "target": dataclasses.asdict(target),
           "compiler": compiler_versions(), "lowering": lowering_source_hash()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


class Cache:
    def __init__(self, root: str | None = None):
        self.root = os.path.join(root or cache_dir(), "kernels")

    def _dir(self, key: str) -> str:
        return os.path.join(self.root, key[:2], key)

    def get(self, key: str) -> tuple[bytes, str, dict[str, Any]] | None:
        """(code object, isa text, metadata) or None on a miss or a damaged entry."""
        d = self._dir(key)
        try:
            with open(os.path.join(d, "meta.json")) as f:
                meta = json.load(f)
            with open(os.path.join(d, "code"), "rb") as f:
                code = f.read()
            with open(os.path.join(d, "isa")) as f:
                isa = f.read()
        except (OSError, ValueError):
            return None
        if hashlib.sha256(code).hexdigest() != meta.get("sha256"):
            return None  # damaged: recompile
        return code, isa, meta

    def put(self, key: str, code: bytes, isa: str, meta: dict[str, Any]) -> None:
        """Write into a temp dir then rename: concurrent builds never see a partial entry."""
        d = self._dir(key)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{key[:8]}-", dir=os.path.dirname(d))
        try:
            with open(os.path.join(tmp, "code"), "wb") as f:
                f.write(code)
            with open(os.path.join(tmp, "isa"), "w") as f:
                f.write(isa)
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump({**meta, "sha256": hashlib.sha256(code).hexdigest()}, f)
            if os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)  # a damaged entry being replaced
            os.rename(tmp, d)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process won the race: fine
