"""Ahead-of-time build: every registered op variant for one target, plus its manifest.

    OUT/<arch>/<instance>.<hsaco|cubin>   code object
    OUT/<arch>/<instance>.<s|ptx>         its assembly
    OUT/<arch>/manifest.json              what the runtime loads (peerdsl.runtime.manifest)
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import time
from typing import Any, Callable

from ..dsl import ir
from ..dsl.kernel import Kernel
from .cache import Cache, cache_key, jsonable
from .targets import Target, get_target
from .toolchain import compiler_versions

MANIFEST = "manifest.json"


@dataclasses.dataclass
class KernelBuild:
    """One built kernel: its manifest entry, code object and ISA, and how it was obtained."""
    instance: str
    entry: dict[str, Any]
    code: bytes
    isa: str
    cached: bool
    seconds: float


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
    from ..runtime.kernel_signature import annotate_args  # what the launch checks read
    entry = {
        "op": op, "symbol": instance, "file": f"{instance}.{t.code_object_ext}",
        "sha256": hashlib.sha256(code).hexdigest(), "isa_file": f"{instance}{t.isa_ext}",
        "constexprs": jsonable(constexprs), "block_size": traced.block_size,
        "lds_bytes": meta["lds_bytes"], "args": annotate_args(meta["args"], kernel, traced),
        "kernarg_size": meta["kernarg_size"], "resources": meta["resources"], "cache_key": key}
    return KernelBuild(instance, entry, code, isa, cached, time.perf_counter() - t0)


def _write(path: str, data: bytes | str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    os.replace(tmp, path)


def build(arch: str, ops: list[str] | None = None, out_dir: str = "build",
          use_cache: bool = True, jobs: int | None = None,
          progress: Callable[[KernelBuild], None] | None = None) -> dict[str, Any]:
    """Build every variant of `ops` (all registered ops when None) for `arch`.

    Returns the manifest (also written to OUT/<arch>/manifest.json).
    """
    from ..ops.registry import build_items
    t = get_target(arch)
    items = build_items(t, ops)
    out = os.path.join(out_dir, t.arch)
    os.makedirs(out, exist_ok=True)
    cache = Cache()
    jobs = jobs or min(8, os.cpu_count() or 1)
    # Trace on this thread (the tracer's state is global), compile on threads: the heavy
    # work runs in MLIR worker processes and ptxas subprocesses.
    traced = [k.trace(**cx) for _op, k, cx in items]
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        futs = [ex.submit(compile_cached, op, k, cx, t, use_cache, cache, tr)
                for (op, k, cx), tr in zip(items, traced)]
        for f in concurrent.futures.as_completed(futs):  # report progress as it happens
            if progress:
                progress(f.result())
        results = [f.result() for f in futs]
    kernels: dict[str, Any] = {}
    for r in results:
        if r.instance in kernels:
            other = kernels[r.instance]
            raise RuntimeError(f"instance {r.instance} is built twice (ops {other['op']} and "
                               f"{r.entry['op']}): register each kernel variant under one op")
        _write(os.path.join(out, r.entry["file"]), r.code)
        _write(os.path.join(out, r.entry["isa_file"]), r.isa)
        kernels[r.instance] = r.entry
    manifest = {"arch": t.arch, "vendor": t.vendor, "wave_size": t.wave_size,
                "fp8_format": t.fp8_format, "compiler": compiler_versions(),
                "kernels": dict(sorted(kernels.items()))}
    _write(os.path.join(out, MANIFEST), json.dumps(manifest, indent=1) + "\n")
    return manifest


def instance_ir(kernel: Kernel, constexprs: dict[str, Any]) -> str:
    """The printed IR of one variant (what the cache key hashes), for debugging."""
    return ir.print_kernel(kernel.trace(**constexprs), with_locs=True)
