"""`peerdsl compare OP --ref FILE --arch ARCH`: a DSL kernel beside its hand-written HIP twin.

Static by default: registers, LDS, scratch/spills and instruction counts by class, for the
DSL variant in the manifest (T, H, W; bf16 / 6144 / 4 unless told) and the reference symbol
of the same shape built from FILE (reference/hip/<OP>.hip by default). AMD resources come
from each code object's NT_AMDGPU_METADATA note, counts from the ISA text (the DSL's .s
beside its code object; clang -S for the reference). NVIDIA: `ptxas -v` and PTX counts.

`--run` (sm_90, on a GPU) launches both on the same inputs and reports byte equality and
latency: see compare_run.py.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path
from typing import Any

HELP = "compare a DSL kernel with the HIP reference (resources, instruction classes, --run)"
OPS = ("fused_ar_rms_1stage", "allreduce_ll")

# ----------------------------------------------------------------------------- ISA classes
# AMD mnemonics (gfx12 spelling; s_waitcnt* and dword forms for the older targets).
_AMD_CLASSES: list[tuple[str, re.Pattern]] = [
    ("global load b32", re.compile(r"^global_load_(b32|dword)$")),
    ("global load b64", re.compile(r"^global_load_(b64|dwordx2)$")),
    ("global load b128", re.compile(r"^global_load_(b128|dwordx4)$")),
    ("global load other", re.compile(r"^global_load_")),
    ("global store b32", re.compile(r"^global_store_(b32|dword)$")),
    ("global store b64", re.compile(r"^global_store_(b64|dwordx2)$")),
    ("global store b128", re.compile(r"^global_store_(b128|dwordx4)$")),
    ("global store other", re.compile(r"^global_store_")),
    ("flat load/store", re.compile(r"^flat_(load|store)")),
    ("scalar loads", re.compile(r"^s_(buffer_)?load")),
    ("atomics", re.compile(r"^(global|flat|buffer)_atomic_")),
    ("LDS (ds_*)", re.compile(r"^ds_")),
    ("cache wb/inv", re.compile(r"^(global_inv|global_wb|buffer_inv|buffer_wbl2|buffer_gl)")),
    ("waits (s_wait*)", re.compile(r"^s_wait")),
    ("barriers", re.compile(r"^s_barrier")),
    ("branches", re.compile(r"^s_(c?branch)")),
]
CLASS_ORDER = [name for name, _ in _AMD_CLASSES] + ["fences", "total"]


def _amd_mnemonic(line: str) -> str | None:
    """The mnemonic of an ISA line (clang -S or llvm-objdump), None for anything else."""
    s = line.split(";", 1)[0].split("//", 1)[0].strip()
    if not s or s.startswith(".") or s.endswith(":") or re.match(r"^[0-9a-f]+ <", s):
        return None
    return s.split()[0]


def function_lines(text: str, symbol: str) -> list[str]:
    """The lines of `symbol`'s body in an assembly listing (clang -S, our .s, or objdump)."""
    lines = text.splitlines()
    start = None
    for i, ln in enumerate(lines):
        s = ln.split(";", 1)[0].strip()  # clang -S writes "sym:  ; @sym"
        if s == f"{symbol}:" or s.endswith(f"<{symbol}>:"):
            start = i + 1
            break
    if start is None:
        raise KeyError(f"no function {symbol!r} in the ISA text")
    out = []
    for ln in lines[start:]:
        s = ln.strip()
        # clang -S ends a function with .Lfunc_endN:; objdump starts the next with <sym>:
        if s.startswith(".Lfunc_end") or s.startswith(".size") or re.match(r"^[0-9a-f]+ <", s):
            break
        out.append(ln)
    return out


def count_amd(lines: list[str]) -> dict[str, int]:
    counts: collections.Counter = collections.Counter()
    for ln in lines:
        m = _amd_mnemonic(ln)
        if m is None:
            continue
        counts["total"] += 1
        for name, pat in _AMD_CLASSES:
            if pat.search(m):
                counts[name] += 1
                break
    return {k: counts.get(k, 0) for k in CLASS_ORDER if k != "fences"}


# PTX: ld/st outside param/shared/local/const are global (generic pointers to global here).
_PTX_MEM = re.compile(r"^(ld|st)((?:\.[a-z0-9_]+)*)$")
_PTX_BITS = re.compile(r"\.[busf](8|16|32|64|128)\b")


def _ptx_width(mods: str) -> int:
    vec = 4 if ".v4" in mods else 2 if ".v2" in mods else 1
    bits = _PTX_BITS.findall(mods)
    return vec * int(bits[-1]) if bits else 0


def count_ptx(lines: list[str]) -> dict[str, int]:
    counts: collections.Counter = collections.Counter()
    for ln in lines:
        for stmt in ln.split("//", 1)[0].replace("{", " ").replace("}", " ").split(";"):
            s = stmt.strip()
            if not s or s.startswith(".") or s.endswith(":") or s.startswith("@%") and " " not in s:
                continue
            if s.startswith("@"):
                s = s.split(None, 1)[1] if " " in s else ""
            op = s.split()[0] if s else ""
            if not op or not re.match(r"^[a-z]", op):
                continue
            counts["total"] += 1
            m = _PTX_MEM.match(op)
            if m and not re.search(r"\.(param|shared|local|const)\b", m.group(2)):
                kind = "load" if m.group(1) == "ld" else "store"
                w = _ptx_width(m.group(2))
                cls = f"global {kind} b{w}" if w in (32, 64, 128) else f"global {kind} other"
                counts[cls] += 1
            elif m and ".shared" in m.group(2):
                counts["LDS (ds_*)"] += 1
            elif op.startswith(("atom", "red.")):
                counts["atomics"] += 1
            elif op.startswith(("fence", "membar")):
                counts["fences"] += 1
            elif op.startswith(("bar.", "barrier")):
                counts["barriers"] += 1
            elif op.startswith(("bra", "brx")):
                counts["branches"] += 1
    return {k: counts.get(k, 0) for k in CLASS_ORDER
            if k not in ("flat load/store", "scalar loads", "cache wb/inv", "waits (s_wait*)")}


def ptx_function(text: str, symbol: str) -> list[str]:
    m = re.search(rf"\.entry\s+{re.escape(symbol)}\s*\((.*?)^\}}", text, re.S | re.M)
    if not m:
        raise KeyError(f"no .entry {symbol!r} in the PTX")
    return m.group(0).splitlines()


# ----------------------------------------------------------------------------- the two sides
def ref_symbol(op: str, T: str, H: int, W: int) -> str:
    """The reference's extern "C" name for a shape (see the REF_* macros in the .hip files)."""
    if op == "fused_ar_rms_1stage":
        return f"{op}_{T}_h{H}_w{W}"
    if op == "allreduce_ll":
        return f"{op}_{T}_w{W}"
    raise KeyError(f"no reference for op {op!r} (have {OPS})")


def side_amd(code_object: Path, isa_text: str, symbol: str) -> dict[str, Any]:
    from .lowering.codeobject import read_amd
    info = read_amd(code_object.read_bytes(), symbol)
    r = info.resources
    row = {"kernel": symbol, "code object": str(code_object), "VGPRs": r["vgpr"],
           "AGPRs": r["agpr"], "SGPRs": r["sgpr"], "LDS bytes": info.lds_bytes,
           "scratch bytes": r["scratch_bytes"],
           "spills (vgpr/sgpr)": f"{r['vgpr_spill']}/{r['sgpr_spill']}",
           "kernarg bytes": info.kernarg_size, "wave": info.wave_size}
    row.update(count_amd(function_lines(isa_text, symbol)))
    return row


def side_nvidia(code_object: Path, ptx_text: str, symbol: str, ptxas: dict[str, int]) -> dict:
    row = {"kernel": symbol, "code object": str(code_object), "registers": ptxas["registers"],
           "smem bytes": ptxas["smem_bytes"], "stack bytes": ptxas["stack_bytes"],
           "spills (st/ld)": f"{ptxas['spill_stores']}/{ptxas['spill_loads']}",
           "barriers used": ptxas["barriers"]}
    row.update({f"PTX {k}": v for k, v in count_ptx(ptx_function(ptx_text, symbol)).items()})
    return row


def dsl_side(build: Path, arch: str, op: str, T: str, H: int, W: int) -> dict[str, Any]:
    from .runtime.manifest import load_manifest
    m = load_manifest(build, arch)
    query: dict[str, Any] = {"T": T, "W": W}
    if op == "fused_ar_rms_1stage":
        query["H"] = H
    e = m.find(op, query)
    isa = e.path.parent / e.raw.get("isa_file", e.path.with_suffix(".s" if arch.startswith(
        "gfx") else ".ptx").name)
    if arch.startswith("gfx"):
        return side_amd(e.path, isa.read_text(), e.symbol)
    ptxas = dict(e.resources)
    return side_nvidia(e.path, isa.read_text(), e.symbol, ptxas)


def ref_side(ref: Path, out: Path, arch: str, op: str, T: str, H: int, W: int) -> dict:
    from . import reference_build as rb
    art = rb.build(ref, arch, out)
    sym = ref_symbol(op, T, H, W)
    if arch.startswith("gfx"):
        return side_amd(art.code_object, art.isa.read_text(), sym)
    ptxas = _ptxas_resources(art.ptxas_log.read_text(), sym)
    return side_nvidia(art.code_object, art.isa.read_text(), sym, ptxas)


def _ptxas_resources(log: str, symbol: str) -> dict[str, int]:
    try:
        from .lowering.codeobject import parse_ptxas_log
    except ImportError:  # the GPU machine has no pyelftools: the same report, parsed here
        m = re.search(rf"Function properties for {re.escape(symbol)}(.*?)(?=Compiling|\Z)",
                      log, re.S)
        block = m.group(1) if m else ""
        pats = {"registers": r"Used (\d+) registers", "spill_stores": r"(\d+) bytes spill st",
                "spill_loads": r"(\d+) bytes spill lo", "stack_bytes": r"(\d+) bytes stack",
                "smem_bytes": r"(\d+) bytes smem", "barriers": r"used (\d+) barriers"}
        return {k: int(h.group(1)) if (h := re.search(p, block)) else 0
                for k, p in pats.items()}
    return parse_ptxas_log(log, symbol)


def table(dsl: dict[str, Any], ref: dict[str, Any], markdown: bool = False) -> str:
    keys = list(dict.fromkeys(list(dsl) + list(ref)))
    if markdown:
        rows = ["| | DSL | HIP reference |", "|---|---|---|"]
        rows += [f"| {k} | {dsl.get(k, '-')} | {ref.get(k, '-')} |" for k in keys
                 if k != "code object"]
        return "\n".join(rows)
    w0 = max(len(k) for k in keys)
    w1 = max(len("DSL"), *(len(str(dsl.get(k, "-"))) for k in keys))
    lines = [f"{'':{w0}}  {'DSL':<{w1}}  HIP reference"]
    lines += [f"{k:{w0}}  {str(dsl.get(k, '-')):<{w1}}  {ref.get(k, '-')}" for k in keys]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI plugin
def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", choices=OPS, help="DSL op to compare")
    p.add_argument("--ref", default=None,
                   help="reference HIP source (default: reference/hip/<op>.hip)")
    p.add_argument("--arch", default="gfx1250", help="gfx1250 (static) or sm_90 (static, --run)")
    p.add_argument("--build", default="build", help="DSL build directory (peerdsl build -o)")
    p.add_argument("--ref-build", default="build/reference",
                   help="where the reference is built (default: build/reference)")
    p.add_argument("--T", default="bf16", choices=("bf16",), help="element type")
    p.add_argument("--H", type=int, default=6144, help="hidden size (fused op)")
    p.add_argument("--W", type=int, default=4, help="world size")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--run", action="store_true",
                   help="sm_90 only: run both on the GPU, report byte equality and latency")
    p.add_argument("--rows", type=int, default=0,
                   help="--run: rows of H (default 1024 fused, 256 = 3 MiB LL)")
    p.add_argument("--grid", type=int, default=0, help="--run: blocks per rank (0: as runtime)")
    p.add_argument("--iters", type=int, default=50, help="--run: timed launches")


def run(args: argparse.Namespace) -> int:
    from . import reference_build as rb
    ref = Path(args.ref) if args.ref else rb.REF_DIR / f"{args.op}.hip"
    if not ref.exists():
        print(f"peerdsl compare: no reference source {ref}", file=sys.stderr)
        return 2
    why = rb.missing_reason(args.arch)
    if why:
        print(f"peerdsl compare: cannot build the reference for {args.arch}: {why}",
              file=sys.stderr)
        return 2
    try:
        dsl = dsl_side(Path(args.build), args.arch, args.op, args.T, args.H, args.W)
        refd = ref_side(ref, Path(args.ref_build), args.arch, args.op, args.T, args.H, args.W)
    except Exception as e:  # manifest missing, compiler error, symbol absent: say which
        print(f"peerdsl compare: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    shape = f"T={args.T}, W={args.W}" + (f", H={args.H}" if args.op != "allreduce_ll" else "")
    print(f"{args.op} on {args.arch} ({shape}): DSL vs HIP reference ({ref})")
    print(table(dsl, refd, args.markdown))
    if args.run:
        if not args.arch.startswith("sm_"):
            print("peerdsl compare --run: needs --arch sm_90 (the lent GPU is an H200)",
                  file=sys.stderr)
            return 2
        from .compare_run import run_both
        return run_both(args, refd["code object"])
    return 0
