"""`peerdsl` command line. Subcommands are a table: name -> (help, add_args, run).

`build` lives here. Others (demo, bench, compare, ...) plug in by adding a module to
`PLUGINS`: the module defines `HELP: str`, `add_args(parser)` and `run(args) -> int`, and is
imported only when present, so a missing optional piece never breaks `peerdsl build`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from typing import Callable

AddArgs = Callable[[argparse.ArgumentParser], None]
Run = Callable[[argparse.Namespace], int]

SUBCOMMANDS: dict[str, tuple[str, AddArgs, Run]] = {}
PLUGINS: dict[str, str] = {  # subcommand -> module providing HELP, add_args, run
    "demo": "peerdsl.demo",
    "bench": "peerdsl.bench",
    "compare": "peerdsl.compare",
}


def subcommand(name: str, help: str, add_args: AddArgs, run: Run) -> None:
    SUBCOMMANDS[name] = (help, add_args, run)


# ----------------------------------------------------------------------------- build

def _build_args(p: argparse.ArgumentParser) -> None:
    from .lowering.targets import supported
    p.add_argument("--arch", required=True, action="append",
                   help=f"target ({', '.join(supported())}, or all); repeat or comma-separate "
                   "for several")
    p.add_argument("--module", action="append", default=[], metavar="FILE_OR_MODULE",
                   help="import a user module (a .py path or a dotted name) whose ops "
                   "(peerdsl.register_op) are built too; repeat for several")
    p.add_argument("--ops", default="all", help="'all' or a comma-separated list of op names "
                   "(shipped or from --module)")
    p.add_argument("-o", "--out", default="build", help="output directory (default: build); "
                   "its manifest is merged: other ops' entries are kept")
    p.add_argument("--no-cache", action="store_true", help="recompile everything, bypass the cache")
    p.add_argument("-j", "--jobs", type=int, default=None, help="parallel compiles")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the summary")


def _build_run(args: argparse.Namespace) -> int:
    """Import the modules, plan (trace + compile) every arch, merge, and only then write:
    bad input exits 2 and a compiler failure 1, with nothing written either way."""
    from .dsl.builder import TraceError
    from .lowering.build import (BuildError, commit_build, merge_build, plan_build,
                                 resolve_target)
    from .lowering.errors import CompileError
    from .lowering.targets import supported
    from .ops.registry import RegistryError, import_module
    archs = [a for spec in args.arch for a in spec.split(",") if a]
    archs = list(dict.fromkeys(t for a in archs for t in (supported() if a == "all" else [a])))
    ops = None if args.ops == "all" else [o for o in args.ops.split(",") if o]

    def progress(r) -> None:
        if not args.quiet:
            tag = "cached" if r.cached else f"{r.seconds:.2f}s"
            print(f"  {r.instance:40s} {r.entry['op']:24s} {tag}")

    t0 = time.perf_counter()
    arch = "?"
    try:
        for spec in args.module:
            import_module(spec)
        for arch in archs:
            resolve_target(arch)  # every arch is checked before anything compiles
        plans = []
        for arch in archs:
            plans.append(plan_build(arch, ops, use_cache=not args.no_cache, jobs=args.jobs,
                                    progress=progress))
        writes = [merge_build(p, args.out) for p in plans]
    except (BuildError, RegistryError, TraceError) as e:
        print(f"peerdsl build: {e}\nnothing was written", file=sys.stderr)
        return 2
    except CompileError as e:
        print(f"peerdsl build --arch {arch}: {e}\nnothing was written", file=sys.stderr)
        return 1
    for w in writes:
        m = commit_build(w)
        built = len(m["kernels"]) - w.kept
        kept = f", {w.kept} kept from other ops" if w.kept else ""
        print(f"{m['arch']}: {built} kernels{kept} -> {os.path.join(w.out, 'manifest.json')}")
    print(f"built in {time.perf_counter() - t0:.1f}s")
    return 0


subcommand("build", "compile the registered ops (and --module ones) ahead of time for a target",
           _build_args, _build_run)


# ----------------------------------------------------------------------------- main

def _load_plugins() -> None:
    for name, modname in PLUGINS.items():
        if name in SUBCOMMANDS:
            continue
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name and modname.startswith(e.name):
                continue  # not written yet / not installed: no such subcommand
            raise
        subcommand(name, getattr(mod, "HELP", name), mod.add_args, mod.run)


def make_parser() -> argparse.ArgumentParser:
    _load_plugins()
    parser = argparse.ArgumentParser(prog="peerdsl", description="peerdsl: fused multi-GPU "
                                     "collectives in a Python kernel DSL")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_, add_args, _run) in SUBCOMMANDS.items():
        add_args(sub.add_parser(name, help=help_, description=help_))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    return SUBCOMMANDS[args.command][2](args)


if __name__ == "__main__":
    sys.exit(main())
