"""`peerdsl compare OP --ref FILE.hip --arch ARCH`: any DSL op beside a hand-written HIP kernel.

    peerdsl compare OP [--ref FILE.hip] [--ref-symbol NAME] [--arch gfx1250|gfx950|gfx942|sm_90]
                       [--constexpr K=V ...] [--build DIR] [--module FILE_OR_MODULE ...]
                       [--run --inputs MODULE:FUNCTION [--recipe-arg K=V ...] [--world N]]

Static by default: a side-by-side table of resources (AMD: VGPR/AGPR/SGPR, LDS, scratch,
spills, occupancy; sm_90: registers, shared/local memory, spills) and instruction classes
counted from each side's ISA (isa_stats.py). The DSL side is the op's variant in BUILD's
manifest, or, when the manifest lacks it, compiled on demand through the build cache. The
reference side is FILE built by reference_build.py (clang-22 for AMD, nvcc for sm_90); its
kernel is --ref-symbol, else picked by name (compare_sides.pick_ref_symbol).

`--run` (sm_90, on a GPU) launches both on the inputs a recipe makes and reports byte
equality and latency (compare_run.py: the recipe API; compare_gpu.py: the launch). Shipped
ops have default recipes and default constexprs in compare_recipes.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from . import isa_stats
from .compare_run import CompareError

HELP = "compare any DSL op with a HIP kernel (resources, instruction classes, --run on sm_90)"
ARCHS = ("gfx1250", "gfx950", "gfx942", "sm_90")


# ----------------------------------------------------------------------------- table
def table(dsl: Any, ref: Any, markdown: bool = False) -> str:
    """The side-by-side table of two compare_sides.Side: resources, then the instruction
    classes (children indented under their group), with DSL - reference for numbers."""
    rows: list[tuple[str, Any, Any]] = [("kernel", dsl.kernel, ref.kernel),
                                        ("from", dsl.origin, ref.origin)]
    keys = list(dict.fromkeys([*dsl.resources, *ref.resources]))
    rows += [(k, dsl.resources.get(k, "-"), ref.resources.get(k, "-")) for k in keys]
    rows += [(isa_stats.row_label(k), dsl.counts.get(k, 0), ref.counts.get(k, 0))
             for k in isa_stats.merged_rows(dsl.counts, ref.counts)]

    def delta(a: Any, b: Any) -> str:
        return f"{a - b:+d}" if isinstance(a, int) and isinstance(b, int) and a != b else ""

    if markdown:
        out = [f"DSL from: {dsl.origin}  ", f"HIP reference from: {ref.origin}", "",
               "| | DSL | HIP reference | DSL - ref |", "|---|---|---|---|"]
        out += [f"| {k.replace('  ', '&nbsp;&nbsp;')} | {a} | {b} | {delta(a, b)} |"
                for k, a, b in rows if k != "from"]
        return "\n".join(out)
    w0 = max(len(k) for k, _, _ in rows)
    w1 = max(len("DSL"), *(len(str(a)) for k, a, _ in rows if k != "from"))
    w2 = max(len("HIP reference"), *(len(str(b)) for k, _, b in rows if k != "from"))
    out = [f"{'':{w0}}  {'DSL':<{w1}}  {'HIP reference':<{w2}}  DSL - ref"]
    for k, a, b in rows:
        if k == "from":  # long paths: one line per side instead of a column
            out.insert(1, f"DSL from: {a}\nHIP reference from: {b}")
            continue
        out.append(f"{k:{w0}}  {str(a):<{w1}}  {str(b):<{w2}}  {delta(a, b)}".rstrip())
    return "\n".join(out)


# ----------------------------------------------------------------------------- CLI plugin
def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", help="the DSL op (shipped, or registered by a --module)")
    p.add_argument("--ref", default=None,
                   help="the HIP source to compare with (default: reference/hip/<op>.hip)")
    p.add_argument("--ref-symbol", default=None, metavar="NAME",
                   help="the kernel in --ref ({K} placeholders take the constexprs, e.g. "
                   "myop_{T}_w{W}); default: picked by name")
    p.add_argument("--arch", default="gfx1250", choices=ARCHS,
                   help="target (static table on all; --run on sm_90)")
    p.add_argument("--constexpr", "-c", action="append", default=[], metavar="K=V",
                   help="the op variant (repeat, or comma-separate); defaults from the op's "
                   "recipe where it has one")
    p.add_argument("--build", default="build",
                   help="DSL build directory (peerdsl build -o); a variant missing there is "
                   "compiled through the build cache")
    p.add_argument("--module", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="a Python module or .py file registering user ops (repeatable)")
    p.add_argument("--ref-build", default="build/reference",
                   help="where the reference (and on-demand DSL copies) are built")
    p.add_argument("--ref-include", action="append", default=[], metavar="DIR",
                   help="another include directory for --ref (ref_common.h is always found)")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument("--run", action="store_true",
                   help="sm_90 only: run both on the GPU, report byte equality and latency")
    p.add_argument("--inputs", default=None, metavar="MODULE:FUNCTION",
                   help="--run: the recipe making both sides' arguments (compare_run.py); "
                   "default: the op's recipe in peerdsl/compare_recipes.py")
    p.add_argument("--recipe-arg", action="append", default=[], metavar="K=V",
                   help="--run: an option for the recipe (e.g. rows=16)")
    p.add_argument("--world", type=int, default=0,
                   help="--run: ranks (default: the variant's W constexpr, else 1)")
    p.add_argument("--grid", type=int, default=0,
                   help="--run: at most this many blocks per rank (0: as many as stay resident)")
    p.add_argument("--iters", type=int, default=50, help="--run: timed launches")


def _options(items: list[str]) -> dict[str, str]:
    out = {}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep or not k:
            raise CompareError(f"--recipe-arg {kv!r}: expected NAME=VALUE")
        out[k.strip()] = v.strip()
    return out


def run(args: argparse.Namespace) -> int:
    from .lowering.errors import CompileError
    from .reference_build import ReferenceBuildError
    from .runtime.manifest import ManifestError
    try:
        return _run(args)
    except CompareError as e:
        print(f"peerdsl compare: {e}", file=sys.stderr)
        return 2
    except (ReferenceBuildError, ManifestError, CompileError, OSError) as e:
        print(f"peerdsl compare: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    from . import compare_sides as cs
    from . import reference_build as rb
    from .compare_run import default_recipe, load_recipe
    recipe = load_recipe(args.inputs) if args.inputs else default_recipe(args.op)
    if args.run and args.arch != "sm_90":
        raise CompareError(f"--run needs --arch sm_90 (the lent GPU is an H200); {args.arch} "
                           "compares statically")
    if args.run and recipe is None:
        raise CompareError(f"--run needs --inputs MODULE:FUNCTION, a recipe making both sides' "
                           f"arguments ({args.op} has no shipped one; see "
                           "peerdsl/compare_recipes.py for two)")
    ref = Path(args.ref) if args.ref else rb.REF_DIR / f"{args.op}.hip"
    if not ref.is_file():
        raise CompareError(f"no reference source {ref}" + ("" if args.ref else
                           "; pass --ref FILE.hip"))
    why = rb.missing_reason(args.arch)
    if why:
        raise CompareError(f"cannot build the reference for {args.arch}: {why}")
    query = {**(getattr(recipe, "constexprs", None) or {}), **cs.parse_constexprs(args.constexpr)}
    dsl, note = cs.dsl_kernel(args.op, args.arch, query, Path(args.build),
                              Path(args.ref_build) / "dsl", args.module)
    art = rb.build(ref, args.arch, Path(args.ref_build),
                   tuple(Path(d) for d in args.ref_include))
    text = art.isa.read_text()
    sym, how = cs.pick_ref_symbol(isa_stats.kernel_names(text), args.op, dsl.entry.constexprs,
                                  args.ref_symbol)
    ref_code = art.code_object.read_bytes()
    if args.arch == "sm_90":
        d = cs.nvidia_side(dsl.entry.code_object(), dsl.isa, dsl.entry.symbol,
                           dsl.entry.resources, dsl.entry.kernarg_size, dsl.origin)
        r = cs.nvidia_side(ref_code, text, sym, cs.ptxas_resources(art.ptxas_log.read_text(), sym),
                           cs.cubin_param_bytes(ref_code, sym), str(art.code_object))
    else:
        d = cs.amd_side(args.arch, dsl.entry.code_object(), dsl.isa, dsl.entry.symbol,
                        dsl.origin)
        r = cs.amd_side(args.arch, ref_code, text, sym, str(art.code_object))
    shape = ", ".join(f"{k}={v}" for k, v in dsl.entry.constexprs.items())
    print(f"{args.op} on {args.arch} ({shape}): DSL vs HIP reference {ref} "
          f"(kernel {sym}: {how})")
    if note:
        print(f"note: {note}")
    print(table(d, r, args.markdown))
    if not args.run:
        return 0
    from .compare_gpu import run_compare
    from .compare_run import format_report
    world = args.world or int(dsl.entry.constexprs.get("W", 1))
    report = run_compare(dsl.manifest, dsl.entry, art.code_object, sym, recipe, world=world,
                         grid_limit=args.grid, iters=args.iters,
                         options=_options(args.recipe_arg))
    print()
    print(format_report(report))
    return 0 if report.ok else 1
