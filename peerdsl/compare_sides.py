"""The two sides of `peerdsl compare`: the DSL kernel (from a manifest, else compiled on
demand through the build cache) and the reference kernel (a HIP file built by
reference_build.py), each summarized as resources + instruction classes (isa_stats.py).

Nothing here is specific to an op: the DSL kernel is found by op name + constexprs, the
reference symbol by --ref-symbol or by the names the reference file defines.
"""
from __future__ import annotations

import dataclasses
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from . import isa_stats
from .compare_run import CompareError, import_module_spec
from .runtime.manifest import (KNOWN_ARCHS, KernelEntry, Manifest, ManifestError,
                               constexpr_json, load_manifest)


@dataclasses.dataclass
class DslKernel:
    manifest: Manifest
    entry: KernelEntry
    isa: str
    origin: str          # where it came from, for the table header


@dataclasses.dataclass
class Side:
    kernel: str
    origin: str
    resources: dict[str, Any]
    counts: dict[str, int]


def parse_constexprs(items: list[str]) -> dict[str, Any]:
    """["H=6144", "T=bf16,W=4"] -> {"H": 6144, "T": "bf16", "W": 4} (ints, floats, bools)."""
    out: dict[str, Any] = {}
    for item in items:
        for kv in (p for p in item.split(",") if p):
            k, sep, v = kv.partition("=")
            if not sep or not k.strip():
                raise CompareError(f"--constexpr {kv!r}: expected NAME=VALUE (e.g. H=6144)")
            out[k.strip()] = _value(v.strip())
    return out


def _value(v: str) -> Any:
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    for kind in (int, float):
        try:
            return kind(v)
        except ValueError:
            pass
    return v


def _same(a: Any, b: Any) -> bool:
    return json.dumps(constexpr_json(a), sort_keys=True) == json.dumps(constexpr_json(b),
                                                                       sort_keys=True)


def _matches(have: dict[str, Any], query: dict[str, Any]) -> bool:
    return all(k in have and _same(have[k], v) for k, v in query.items())


def build_hint(op: str, arch: str, modules: list[str], out: str) -> str:
    mods = "".join(f" --module {m}" for m in modules) or " [--module FILE_OR_MODULE]"
    return f"build it with: peerdsl build --arch {arch}{mods} --ops {op} -o {out}"


def import_modules(modules: list[str]) -> None:
    """The shipped ops, then the user's modules (they register their ops on import)."""
    from .ops.registry import load_all
    load_all()
    for m in modules:
        import_module_spec(m)


def from_manifest(build: Path, arch: str, op: str, query: dict[str, Any]) -> tuple[
        DslKernel | None, str]:
    """The one entry of `op` matching `query` in BUILD's manifest, else (None, why not).
    A query matching several built variants is the user's to narrow: an error."""
    try:
        m = load_manifest(build, arch)
    except ManifestError as e:
        return None, str(e)
    cands = [k for k in m.kernels.values() if k.op == op]
    hits = [k for k in cands if _matches(k.constexprs, query)]
    if len(hits) > 1:
        example = " ".join(f"--constexpr {k}={v}" for k, v in hits[0].constexprs.items())
        raise CompareError(f"--constexpr {query or '(none)'} matches {len(hits)} built variants "
                           f"of {op} in {m.path}; name more of them, e.g. {example}")
    if not hits:
        have = sorted(json.dumps(k.constexprs, sort_keys=True) for k in cands)
        return None, (f"{m.path} has no {op} kernel" + (f" with {query}; built: {have}"
                                                       if cands else f"; ops: {m.ops()}"))
    e = hits[0]
    isa = e.path.with_name(e.raw.get("isa_file") or e.path.with_suffix(
        ".s" if KNOWN_ARCHS[arch][0] == "amd" else ".ptx").name)
    return DslKernel(m, e, isa.read_text(), f"manifest {m.path}"), ""


def pick_variant(op: str, arch: str, query: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(kernel, constexprs) of the registered op for `query`: the one listed variant that
    matches, else the query itself when it names every constexpr of the kernel."""
    from .lowering.targets import get_target
    from .ops.registry import REGISTRY
    if op not in REGISTRY:
        raise CompareError(f"unknown op {op!r}; registered: {sorted(REGISTRY)} (a user op "
                           "needs --module FILE_OR_MODULE, the module that registers it)")
    spec = REGISTRY[op]
    listed = [dict(v) for v in spec.variants(get_target(arch))]
    hits = [v for v in listed if _matches(v, query)]
    if len(hits) == 1:
        return spec.kernel, hits[0]
    shown = [{k: constexpr_json(x) for k, x in v.items()} for v in listed]
    if len(hits) > 1:
        raise CompareError(f"--constexpr {query or '(none)'} matches {len(hits)} variants of "
                           f"{op} for {arch}; name more of them (variants: {shown[:6]}"
                           f"{' ...' if len(shown) > 6 else ''})")
    names = spec.kernel.constexpr_names
    missing = [n for n in names if n not in query]
    unknown = [k for k in query if k not in names]
    if missing or unknown:
        raise CompareError(f"op {op}: no variant for {arch} matches {query}; its constexprs are "
                           f"{names} (missing {missing}, unknown {unknown}); listed variants: "
                           f"{shown[:6]}{' ...' if len(shown) > 6 else ''}")
    return spec.kernel, dict(query)


def compile_on_demand(op: str, arch: str, query: dict[str, Any], scratch: Path) -> DslKernel:
    """Compile one variant through the content-addressed build cache (as `peerdsl build`
    does) and record it in a one-op manifest under SCRATCH/<arch> for the loaders."""
    from .lowering.build import compile_cached
    from .lowering.targets import get_target
    from .lowering.toolchain import compiler_versions
    kernel, constexprs = pick_variant(op, arch, query)
    t = get_target(arch)
    kb = compile_cached(op, kernel, constexprs, t)
    d = scratch / arch
    d.mkdir(parents=True, exist_ok=True)
    (d / kb.entry["file"]).write_bytes(kb.code)
    (d / kb.entry["isa_file"]).write_text(kb.isa)
    mpath = d / "manifest.json"
    try:
        doc = json.loads(mpath.read_text())
    except (OSError, ValueError):
        doc = {}
    kernels = {**(doc.get("kernels") or {}), kb.instance: kb.entry}
    doc = {"arch": t.arch, "vendor": t.vendor, "wave_size": t.wave_size,
           "fp8_format": t.fp8_format, "compiler": compiler_versions(), "kernels": kernels}
    tmp = mpath.with_name(f"manifest.json.tmp{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, mpath)
    m = load_manifest(d, arch)
    how = "cache hit" if kb.cached else f"compiled in {kb.seconds:.1f}s"
    return DslKernel(m, m.get(kb.instance), kb.isa, f"build cache ({how}), copy in {d}")


def dsl_kernel(op: str, arch: str, query: dict[str, Any], build: Path, scratch: Path,
               modules: list[str]) -> tuple[DslKernel, str]:
    """(the DSL kernel, a note when it did not come from BUILD's manifest)."""
    import_modules(modules)
    found, why = from_manifest(build, arch, op, query)
    if found is not None:
        return found, ""
    hint = build_hint(op, arch, modules, str(build))
    try:
        k = compile_on_demand(op, arch, query, scratch)
    except ImportError as e:  # no MLIR bindings here (the GPU machine): say how to build
        raise CompareError(f"{why}; compiling it here needs the MLIR bindings ({e}); "
                           f"{hint}") from None
    return k, f"not in the manifest ({why}): compiled through the build cache; to launch it " \
              f"from a manifest, {hint}"


# ----------------------------------------------------------------------------- reference
def pick_ref_symbol(names: list[str], op: str, constexprs: dict[str, Any],
                    given: str | None) -> tuple[str, str]:
    """(symbol, why). --ref-symbol wins ({K} placeholders take the constexprs); else the
    file's only kernel; else one named OP; else the one whose name spells the most of the
    variant's constexpr values (as `bf16`, `h6144` or `w4`)."""
    if given:
        try:
            sym = given.format(**{k: constexpr_json(v) for k, v in constexprs.items()})
        except (KeyError, IndexError, ValueError) as e:
            raise CompareError(f"--ref-symbol {given!r}: cannot fill {e} from the constexprs "
                               f"{constexprs}") from None
        if sym not in names:
            raise CompareError(f"--ref-symbol {sym}: not a kernel of the reference (it has "
                               f"{names})")
        return sym, "--ref-symbol"
    if not names:
        raise CompareError("the reference defines no kernels (extern \"C\" __global__ ...)")
    if len(names) == 1:
        return names[0], "the only kernel in the file"
    if op in names:
        return op, "named as the op"

    def score(name: str) -> int:
        toks = set(name.lower().split("_"))
        return sum(1 for k, v in constexprs.items()
                   if str(constexpr_json(v)).lower() in toks
                   or f"{k.lower()}{constexpr_json(v)}".lower() in toks)
    pool = [n for n in names if n.startswith(op)] or names
    best = max(score(n) for n in pool)
    top = [n for n in pool if score(n) == best]
    if best == 0 or len(top) > 1:
        raise CompareError(f"cannot tell which reference kernel matches {op} {constexprs} "
                           f"(candidates {top[:8]}); pass --ref-symbol NAME (may use {{K}} "
                           "placeholders, e.g. myop_{T}_h{H})")
    return top[0], f"its name spells {best} of the constexpr values"


# ----------------------------------------------------------------------------- stats
def _symbol_size(code: bytes, symbol: str) -> int | str:
    """Bytes of the function's machine code (its ELF symbol's size), "-" without pyelftools."""
    try:
        from elftools.elf.elffile import ELFFile
    except ImportError:
        return "-"
    elf = ELFFile(io.BytesIO(code))
    tab = elf.get_section_by_name(".symtab")
    for s in tab.iter_symbols() if tab else ():
        if s.name == symbol and s["st_info"]["type"] == "STT_FUNC":
            return int(s["st_size"])
    return "-"


def amd_side(arch: str, code: bytes, isa: str, symbol: str, origin: str) -> Side:
    from .lowering.codeobject import read_amd
    info = read_amd(code, symbol)
    r = info.resources
    block = int(info.metadata.get(".max_flat_workgroup_size", 1024))
    occ = isa_stats.amd_occupancy(arch, r["vgpr"], r["sgpr"], info.lds_bytes, block,
                                  info.wave_size or KNOWN_ARCHS[arch][1])
    res = {"VGPRs": r["vgpr"], "AGPRs": r["agpr"], "SGPRs": r["sgpr"],
           "LDS bytes": info.lds_bytes, "scratch bytes": r["scratch_bytes"],
           "VGPR spills": r["vgpr_spill"], "SGPR spills": r["sgpr_spill"],
           "occupancy (waves/SIMD)": occ, "max block size": block, "wave size": info.wave_size,
           "kernarg bytes": info.kernarg_size, "code bytes": _symbol_size(code, symbol)}
    return Side(symbol, origin, res, isa_stats.count_amd(isa_stats.function_lines(isa, symbol)))


def cubin_param_bytes(code: bytes, symbol: str) -> int | str:
    """The parameter bytes the cubin records for `symbol` ("-" without pyelftools)."""
    try:
        from .lowering.codeobject import cubin_params
    except ImportError:
        return "-"
    params, total = cubin_params(code, symbol)
    return total if total >= 0 else max((o + s for _, o, s in params), default=0)


def ref_param_layout(arch: str, code: bytes, symbol: str) -> tuple[list[tuple[int, int]], int]:
    """([(offset, size)] of the explicit parameters, their total bytes) as the code object
    records them: the AMD metadata note, or the cubin's .nv.info (both need the build
    extras: msgpack, pyelftools)."""
    if KNOWN_ARCHS[arch][0] == "amd":
        from .lowering.codeobject import read_amd
        args = read_amd(code, symbol).args
        params = [(int(a["offset"]), int(a["size"])) for a in args]
        return params, max((o + s for o, s in params), default=0)
    from .lowering.codeobject import cubin_params
    found, total = cubin_params(code, symbol)
    params = [(off, size) for _, off, size in found]
    return params, total if total >= 0 else max((o + s for o, s in params), default=0)


def nvidia_side(code: bytes, ptx: str, symbol: str, ptxas: dict[str, int], param_bytes: Any,
                origin: str) -> Side:
    res = {"registers": ptxas["registers"], "shared bytes": ptxas["smem_bytes"],
           "local bytes (stack)": ptxas["stack_bytes"],
           "spill store bytes": ptxas["spill_stores"], "spill load bytes": ptxas["spill_loads"],
           "barriers": ptxas["barriers"], "param bytes": param_bytes,
           "code bytes (SASS)": _symbol_size(code, symbol)}
    return Side(symbol, origin, res, isa_stats.count_ptx(isa_stats.ptx_function(ptx, symbol)))


_PTXAS = {"registers": r"Used (\d+) registers", "spill_stores": r"(\d+) bytes spill stores",
          "spill_loads": r"(\d+) bytes spill loads", "stack_bytes": r"(\d+) bytes stack frame",
          "smem_bytes": r"(\d+) bytes smem", "barriers": r"used (\d+) barriers"}


def ptxas_resources(log: str, symbol: str) -> dict[str, int]:
    """`ptxas -v` numbers for one function: lowering's parser, or the same regexes here where
    the lowering cannot import (the GPU machine has no pyelftools)."""
    try:
        from .lowering.codeobject import parse_ptxas_log
        return parse_ptxas_log(log, symbol)
    except ImportError:
        pass
    m = re.search(rf"(?:Compiling entry function|Function properties for) '?{re.escape(symbol)}'?"
                  r"(.*?)(?=Compiling entry function|\Z)", log, re.S)
    if not m:
        raise CompareError(f"ptxas -v output has no report for {symbol}")
    return {k: int(h.group(1)) if (h := re.search(p, m.group(0))) else 0
            for k, p in _PTXAS.items()}
