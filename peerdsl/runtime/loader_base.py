"""What the CUDA and HIP loaders share: a manifest of one vendor, kernels found by op +
constexprs (or by the DSL kernel they were built from), and one loaded kernel object per
instance. A backend supplies `_load`; its kernel objects have `entry`,
`launch(grid, args, stream=None, trusted=False)` and `launch_trusted(grid, args, stream=None)`.
"""
from __future__ import annotations

import inspect
import json
import os
from typing import Any, Mapping

from .manifest import KernelEntry, Manifest, ManifestError, constexpr_json, load_manifest


class ManifestLoader:
    vendor = ""        # as the manifest names it
    vendor_name = ""   # as the error message does

    def __init__(self, manifest: Manifest | str | os.PathLike, arch: str | None,
                 device: int):
        self.manifest = manifest if isinstance(manifest, Manifest) else load_manifest(
            manifest, arch)
        if self.manifest.vendor != self.vendor:
            raise ValueError(f"{type(self).__name__} needs an {self.vendor_name} manifest, got "
                             f"{self.manifest.arch}")
        self.device = device
        self._kernels: dict[str, Any] = {}

    def kernel(self, op: str, **constexprs: Any) -> Any:
        """The kernel of `op` with these constexprs (JSON names: T='bf16' or torch dtypes)."""
        return self.load(self.manifest.find(op, constexprs))

    def instance(self, name: str) -> Any:
        return self.load(self.manifest.get(name))

    def load(self, entry: KernelEntry) -> Any:
        k = self._kernels.get(entry.name)
        if k is None:
            k = self._kernels[entry.name] = self._load(entry)
        return k

    def _load(self, entry: KernelEntry) -> Any:
        raise NotImplementedError

    def entry_for(self, op_or_kernel: Any, constexprs: Mapping[str, Any] | None = None
                  ) -> KernelEntry:
        """The manifest entry a user launch runs: of a registered op by name, or of a DSL
        kernel (its instances, by the kernel's name), whose constexprs match `constexprs`
        (a subset that picks one). A variant that is not built raises a ManifestError that
        lists the built ones and the command that builds it."""
        return find_entry(self.manifest, op_or_kernel, dict(constexprs or {}))


def find_entry(manifest: Manifest, op_or_kernel: Any, constexprs: dict[str, Any]) -> KernelEntry:
    query = {k: constexpr_json(v) for k, v in constexprs.items()}
    if isinstance(op_or_kernel, str):
        op, kernel = op_or_kernel, None
        cands = [e for e in manifest.kernels.values() if e.op == op]
        what = f"op {op!r}"
    elif hasattr(op_or_kernel, "instance_name") and hasattr(op_or_kernel, "fn"):
        kernel = op_or_kernel
        try:  # every constexpr given: the instance name says it at once
            hit = manifest.kernels.get(kernel.instance_name(**constexprs))
            if hit is not None:
                return hit
        except Exception:  # noqa: BLE001 - a subset (or a typo): matched below
            pass
        cands = [e for e in manifest.kernels.values() if _instance_of(e.symbol, kernel.name)]
        op = cands[0].op if cands else _registered_name(kernel)
        what = f"kernel {kernel.name!r}"
    else:
        raise TypeError(f"launch takes a registered op name (str) or a dsl kernel "
                        f"(@dsl.kernel), got {type(op_or_kernel).__name__}")
    hits = [e for e in cands if all(k in e.constexprs and _same(e.constexprs[k], v)
                                    for k, v in query.items())]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        names = sorted(set().union(*(h.constexprs for h in hits)) - set(query))
        raise ManifestError(f"{what}: constexprs {query} match {len(hits)} built variants "
                            f"({[h.constexprs for h in hits]}); name more of {names}")
    built = [e.constexprs for e in cands]
    module = _module_of(kernel, cands)
    cmd = build_command(manifest, op, module)
    listing = _closest_listing(built, query) if built else (
        f"nothing of it is built (ops built: {manifest.ops()})")
    add = (f"; the op's variants(target) must list {query}" if built or module else "")
    reg = ("" if op else "; register it first: peerdsl.register_op(NAME, kernel, variants) "
           "in that module")
    raise ManifestError(f"{what} has no {manifest.arch} build with constexprs {query} in "
                        f"{manifest.path}; {listing}. Build it: `{cmd}`{add}{reg}")


def _closest_listing(built: list[dict[str, Any]], query: dict[str, Any], most: int = 8) -> str:
    """The built variants, or, where there are more than `most`, those that differ from the
    query in the fewest constexprs (a shipped op builds hundreds: the full list hides the
    one key that is off)."""
    if len(built) <= most:
        return f"built variants: {built}"

    def off(c: dict[str, Any]) -> list[str]:
        return [k for k, v in query.items() if k not in c or not _same(c[k], v)]
    near = sorted(built, key=lambda c: len(off(c)))[:most]
    return (f"{len(built)} built variants; the closest, with the constexprs each differs in: "
            + "; ".join(f"{c} ({', '.join(off(c))})" for c in near))


def build_command(manifest: Manifest, op: str | None, module: str | None) -> str:
    out = os.path.dirname(os.path.dirname(str(manifest.path))) or "."
    mod = f" --module {module}" if module and not module.startswith("peerdsl.ops") else ""
    return f"peerdsl build --arch {manifest.arch}{mod} --ops {op or 'NAME'} -o {out}"


def _instance_of(symbol: str, kernel_name: str) -> bool:
    """Instance names are NAME_<10 hex digits> (dsl.Kernel.instance_name)."""
    tail = symbol[len(kernel_name) + 1:]
    return (symbol.startswith(kernel_name + "_") and len(tail) == 10
            and all(c in "0123456789abcdef" for c in tail))


def _registered_name(kernel: Any) -> str | None:
    import sys
    reg = sys.modules.get("peerdsl.ops.registry")
    for name, spec in (getattr(reg, "REGISTRY", None) or {}).items():
        if spec.kernel is kernel:
            return name
    return None


def _module_of(kernel: Any, cands: list[KernelEntry]) -> str | None:
    for e in cands:  # where the build says the op came from (provenance), if it says
        mod = e.raw.get("module") or (e.raw.get("provenance") or {}).get("module")
        if isinstance(mod, str) and mod:
            return mod
    if kernel is None:
        return None
    mod = getattr(kernel.fn, "__module__", None)
    if mod in (None, "__main__"):
        try:
            return inspect.getsourcefile(kernel.fn)
        except TypeError:
            return None
    return mod


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
