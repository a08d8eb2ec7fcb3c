"""Ahead-of-time build: every registered op variant for one target, plus its manifest.

    OUT/<arch>/<instance>.<hsaco|cubin>   code object
    OUT/<arch>/<instance>.<s|ptx>         its assembly
    OUT/<arch>/manifest.json              what the runtime loads (peerdsl.runtime.manifest)

A build runs in three steps so that bad input writes nothing: `plan_build` traces and
compiles everything (in memory), `merge_build` reads what OUT already holds and works out
the merged manifest, `commit_build` writes the files and the manifest (each by rename), then
deletes the replaced entries' files. The manifest is merged, never clobbered: building op X
keeps every other op's entries and replaces X's. Each entry records its provenance: the
kernel's module, its source file and sha256, and the compiler versions.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable, Iterable

from ..dsl import ir
from ..dsl.builder import TraceError
from ..dsl.kernel import Kernel
from .cache import Cache, cache_key, jsonable
from .occupancy import derived_resources
from .targets import Target, get_target
from .toolchain import compiler_versions

MANIFEST = "manifest.json"
_PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BuildError(ValueError):
    """Bad input to a build or a compile: an unknown target or op, a user module that does
    not import, a missing constexpr, a kernel that does not trace, a clash with what the
    output directory holds. Nothing was written."""


class KernelTraceError(BuildError, TraceError):
    """A kernel failed to trace (the message names the user's file and line)."""


@dataclasses.dataclass
class KernelBuild:
    """One built kernel: its manifest entry, code object and ISA, and how it was obtained."""
    instance: str
    entry: dict[str, Any]
    code: bytes
    isa: str
    cached: bool
    seconds: float


# ----------------------------------------------------------------------------- one kernel

def _file_sha256(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return ""


def provenance(kernel: Kernel) -> dict[str, Any]:
    """Where an entry came from: the kernel's module and source file (relative to the
    checkout for peerdsl's own ops), the file's sha256 and the compiler versions."""
    path = os.path.abspath(kernel.fn.__code__.co_filename)
    shown = os.path.relpath(path, _PKG_ROOT) if path.startswith(_PKG_ROOT + os.sep) else path
    return {"module": kernel.fn.__module__, "source": shown, "source_sha256": _file_sha256(path),
            "compiler": compiler_versions()}


def kernel_location(kernel: Kernel) -> str:
    code = kernel.fn.__code__
    return f"{code.co_filename}:{code.co_firstlineno}"


def check_constexprs(kernel: Kernel, constexprs: dict[str, Any], what: str) -> dict[str, Any]:
    """Every constexpr without a default is given and no unknown one: else a BuildError
    naming them and the kernel's constexpr parameters. Returns them with the defaults filled
    in, so `SCALE` left to its default and `SCALE=2` are one variant (one instance)."""
    params = kernel.signature.parameters
    missing = [n for n in kernel.constexpr_names
               if n not in constexprs and params[n].default is params[n].empty]
    unknown = [n for n in constexprs if n not in kernel.constexpr_names]
    if missing or unknown:
        parts = ([f"missing constexpr {', '.join(missing)}"] if missing else []) + \
                ([f"unknown constexpr {', '.join(unknown)}"] if unknown else [])
        raise BuildError(f"{what}: {'; '.join(parts)}. Kernel {kernel.name} "
                         f"({kernel_location(kernel)}) has constexpr parameters "
                         f"{kernel.constexpr_names or '(none)'}")
    return {**{n: params[n].default for n in kernel.constexpr_names if n not in constexprs},
            **constexprs}


def trace_kernel(kernel: Kernel, constexprs: dict[str, Any], what: str) -> ir.Kernel:
    """kernel.trace(**constexprs) of checked constexprs (`check_constexprs`), any failure a
    KernelTraceError naming the user's line."""
    from ..ops.registry import user_frame
    try:
        return kernel.trace(**constexprs)
    except Exception as e:  # a TraceError, or a Python error in the user's kernel code
        where = user_frame(e)
        msg = str(e) if isinstance(e, TraceError) else f"{type(e).__name__}: {e}"
        at = "" if where in msg else f" at {where}"
        raise KernelTraceError(f"{what}: kernel {kernel.name} ({kernel_location(kernel)}) does "
                               f"not trace{at}: {msg}") from e


def resolve_target(target: "str | Target") -> Target:
    try:
        return get_target(target)
    except ValueError as e:
        raise BuildError(str(e)) from None


def compile_cached(op: str, kernel: Kernel, constexprs: dict[str, Any], target: "str | Target",
                   use_cache: bool = True, cache: Cache | None = None,
                   traced: ir.Kernel | None = None) -> KernelBuild:
    """Trace, look up the cache, compile on a miss. The entry is the manifest's form.

    Tracing uses process-global state: callers running this in threads pass `traced`
    (traced beforehand on one thread).
    """
    t0 = time.perf_counter()
    t = get_target(target)
    if traced is None:
        traced = kernel.trace(**constexprs)
    instance = kernel.instance_name(**constexprs)
    key = cache_key(traced, instance, t)
    cache = cache or Cache()
    hit = cache.get(key) if use_cache else None
    if hit is not None:
        code, isa, meta = hit
        cached = True
    else:
        from .pipeline import compile_kernel  # the MLIR worker only starts on a miss
        c = compile_kernel(traced, t, instance)
        code, isa = c.binary, c.isa
        meta = {"args": c.args, "kernarg_size": c.kernarg_size, "lds_bytes": c.lds_bytes,
                "resources": c.resources}
        if use_cache:
            cache.put(key, code, isa, meta)
        cached = False
    resources = {**meta["resources"], **derived_resources(t, meta["resources"],
                                                          traced.block_size, meta["lds_bytes"])}
    from ..runtime.kernel_signature import annotate_args  # what the launch checks read
    entry = {
        "op": op, "symbol": instance, "file": f"{instance}.{t.code_object_ext}",
        "sha256": hashlib.sha256(code).hexdigest(), "isa_file": f"{instance}{t.isa_ext}",
        "constexprs": jsonable(constexprs), "block_size": traced.block_size,
        "lds_bytes": meta["lds_bytes"], "args": annotate_args(meta["args"], kernel, traced),
        "kernarg_size": meta["kernarg_size"], "resources": resources, "cache_key": key,
        "provenance": provenance(kernel)}
    return KernelBuild(instance, entry, code, isa, cached, time.perf_counter() - t0)


# ----------------------------------------------------------------------------- a build

@dataclasses.dataclass
class BuildPlan:
    """Everything compiled for one target, nothing written yet."""
    target: Target
    ops: list[str]                 # the ops this build replaces in the manifest
    results: list[KernelBuild]


@dataclasses.dataclass
class BuildWrite:
    """What `commit_build` writes into `out` (OUT/<arch>) and what it deletes."""
    out: str
    manifest: dict[str, Any]
    results: list[KernelBuild]
    stale_files: list[str]
    kept: int                      # entries of other ops kept from the existing manifest


def plan_build(arch: str, ops: list[str] | None = None, use_cache: bool = True,
               jobs: int | None = None,
               progress: Callable[[KernelBuild], None] | None = None) -> BuildPlan:
    """Trace and compile every variant of `ops` (every registered op when None) for `arch`."""
    from ..ops.registry import REGISTRY, RegistryError, build_items
    t = resolve_target(arch)
    try:
        items = build_items(t, ops)
    except RegistryError as e:
        raise BuildError(str(e)) from e
    names = sorted(set(ops)) if ops is not None else sorted(REGISTRY)
    items = [(op, k, check_constexprs(k, cx, f"op {op!r} variant {jsonable(cx)} for {t.arch}"))
             for op, k, cx in items]
    # Trace on this thread (the tracer's state is global), compile on threads: the heavy
    # work runs in MLIR worker processes and ptxas subprocesses.
    traced = [trace_kernel(k, cx, f"op {op!r} variant {jsonable(cx)} for {t.arch}")
              for op, k, cx in items]
    cache = Cache()
    jobs = jobs or min(8, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = [ex.submit(compile_cached, op, k, cx, t, use_cache, cache, tr)
                for (op, k, cx), tr in zip(items, traced)]
        for f in concurrent.futures.as_completed(futs):  # report progress as it happens
            if progress:
                progress(f.result())
        results = [f.result() for f in futs]
    seen: dict[str, str] = {}
    for r in results:
        if r.instance in seen:
            raise BuildError(f"instance {r.instance} is built twice (ops {seen[r.instance]} and "
                             f"{r.entry['op']}): register each kernel variant under one op")
        seen[r.instance] = r.entry["op"]
    return BuildPlan(t, names, results)


def _existing_kernels(path: str, arch: str) -> dict[str, dict[str, Any]]:
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise BuildError(f"{path} cannot be read ({e}); it would be merged with this build: "
                         "delete it or build into another directory") from None
    kernels = doc.get("kernels") if isinstance(doc, dict) else None
    if not isinstance(kernels, dict) or not all(isinstance(k, dict) and "op" in k
                                                for k in kernels.values()):
        raise BuildError(f"{path} is not a peerdsl manifest (no 'kernels' map of entries with "
                         "an 'op'): delete it or build into another directory")
    if doc.get("arch") != arch:
        raise BuildError(f"{path} is for arch {doc.get('arch')!r}, not {arch}")
    return kernels


def _own_files(entry: dict[str, Any]) -> Iterable[str]:
    for key in ("file", "isa_file"):
        name = entry.get(key)
        if isinstance(name, str) and name and os.path.basename(name) == name:
            yield name


def merge_build(plan: BuildPlan, out_dir: str) -> BuildWrite:
    """The merged manifest of OUT/<arch>: the existing entries of every op this build does
    not touch, and this build's entries for its ops (their old entries are dropped)."""
    t = plan.target
    out = os.path.join(out_dir, t.arch)
    existing = _existing_kernels(os.path.join(out, MANIFEST), t.arch)
    replaced = set(plan.ops)
    kept = {name: e for name, e in existing.items() if e["op"] not in replaced}
    kernels = dict(kept)
    for r in plan.results:
        other = kernels.get(r.instance)
        if other is not None:
            raise BuildError(f"instance {r.instance} of op {r.entry['op']!r} is already in "
                             f"{out} as op {other['op']!r} (same kernel name and constexprs): "
                             "rename one of the kernel functions, or rebuild both ops")
        kernels[r.instance] = r.entry
    live = {f for e in kernels.values() for f in _own_files(e)}
    stale = sorted({f for e in existing.values() if e["op"] in replaced
                    for f in _own_files(e)} - live)
    manifest = {"arch": t.arch, "vendor": t.vendor, "wave_size": t.wave_size,
                "fp8_format": t.fp8_format, "compiler": compiler_versions(),
                "kernels": dict(sorted(kernels.items()))}
    return BuildWrite(out, manifest, plan.results, stale, len(kept))


def _write(path: str, data: bytes | str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def commit_build(w: BuildWrite) -> dict[str, Any]:
    """Write the code objects and ISA, then the manifest (each replaced by rename, so a
    reader sees the old manifest or the new one), then delete the replaced entries' files."""
    os.makedirs(w.out, exist_ok=True)
    for r in w.results:
        _write(os.path.join(w.out, r.entry["file"]), r.code)
        _write(os.path.join(w.out, r.entry["isa_file"]), r.isa)
    _write(os.path.join(w.out, MANIFEST), json.dumps(w.manifest, indent=1) + "\n")
    for name in w.stale_files:
        try:
            os.remove(os.path.join(w.out, name))
        except FileNotFoundError:
            pass
    return w.manifest


def build(arch: str, ops: list[str] | None = None, out_dir: str = "build",
          use_cache: bool = True, jobs: int | None = None,
          progress: Callable[[KernelBuild], None] | None = None) -> dict[str, Any]:
    """Build every variant of `ops` (all registered ops when None) for `arch` and merge them
    into OUT/<arch>/manifest.json. Returns the merged manifest."""
    plan = plan_build(arch, ops, use_cache, jobs, progress)
    return commit_build(merge_build(plan, out_dir))


def instance_ir(kernel: Kernel, constexprs: dict[str, Any]) -> str:
    """The printed IR of one variant (what the cache key hashes), for debugging."""
    return ir.print_kernel(kernel.trace(**constexprs), with_locs=True)
