"""Compile time per kernel per target: cold (cache bypassed, MLIR worker already running) and
warm (cache hit: trace + key + read), plus the one-off worker start-up.

    python benchmarks/compile_time.py [--archs gfx1250,sm_90] [--all-variants] [--write]

By default one variant per registered op (its first); --all-variants compiles every variant.
--write appends a dated section (with the commit) to benchmarks/RESULTS.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from peerdsl.lowering import build as B  # noqa: E402
from peerdsl.lowering import pipeline  # noqa: E402
from peerdsl.lowering.cache import Cache  # noqa: E402
from peerdsl.lowering.targets import TARGETS, get_target  # noqa: E402
from peerdsl.ops.registry import build_items  # noqa: E402


def measure(archs: list[str], all_variants: bool) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    pipeline.worker_versions()  # start the worker: imports the MLIR bindings
    startup = time.perf_counter() - t0
    rows = []
    cache = Cache()
    for arch in archs:
        items = build_items(get_target(arch))
        if not all_variants:
            seen: set[str] = set()
            items = [it for it in items if not (it[0] in seen or seen.add(it[0]))]
        for op, k, cx in items:
            t1 = time.perf_counter()
            k.trace(**cx)  # timed apart: the DSL's cost, paid once per process per variant
            trace = time.perf_counter() - t1
            cold = B.compile_cached(op, k, cx, arch, use_cache=False)
            cache.put(cold.entry["cache_key"], cold.code, cold.isa,
                      {key: cold.entry[key] for key in ("args", "kernarg_size", "lds_bytes",
                                                         "resources")})
            warm = min(B.compile_cached(op, k, cx, arch, cache=cache).seconds for _ in range(3))
            rows.append({"arch": arch, "op": op, "instance": cold.instance,
                         "cold": cold.seconds, "warm": warm, "trace": trace, "isa_lines": cold.isa.count("\n")})
            print(f"{arch:8s} {op:24s} cold {cold.seconds * 1e3:7.0f} ms  warm "
                  f"{warm * 1e3:6.1f} ms  trace {trace * 1e3:6.1f} ms", flush=True)
    return startup, rows


def full_build(arch: str, jobs: int) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        m = B.build(arch, None, d, use_cache=False, jobs=jobs)
        return len(m["kernels"]), time.perf_counter() - t0


def report(startup: float, rows: list[dict], builds: list[tuple[str, int, float, int]]) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"## Compile time (lowering), {now}, commit {commit}", "",
           f"CPU machine, {os.cpu_count()} cores. MLIR worker start-up (import of the bindings, "
           f"once per build process): {startup:.2f} s. Cold = cache bypassed, worker running "
           "(AMD: MLIR passes + LLVM codegen twice, for the HSACO and the ISA text, + ld.lld; "
           "NVIDIA: MLIR passes + PTX + ptxas). Warm = cache hit (trace already done, key + "
           "read). Trace = the DSL trace of the variant (first time in the process; a fresh "
           "process pays it before a cache lookup). One variant per op (its first).", "",
           "| target | op | cold ms | warm ms | trace ms |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['arch']} | {r['op']} | {r['cold'] * 1e3:.0f} | {r['warm'] * 1e3:.1f} "
                   f"| {r['trace'] * 1e3:.0f} |")
    out += ["", "| target | cold median ms | cold max ms | warm max ms |", "|---|---|---|---|"]
    for arch in dict.fromkeys(r["arch"] for r in rows):
        c = [r["cold"] for r in rows if r["arch"] == arch]
        w = [r["warm"] for r in rows if r["arch"] == arch]
        out.append(f"| {arch} | {statistics.median(c) * 1e3:.0f} | {max(c) * 1e3:.0f} | "
                   f"{max(w) * 1e3:.1f} |")
    if builds:
        out += ["", "Full `peerdsl build --no-cache` (all variants):", ""]
        for arch, n, secs, jobs in builds:
            out.append(f"- {arch}: {n} kernels in {secs:.1f} s with {jobs} jobs "
                       f"({secs / n * jobs * 1e3:.0f} ms per kernel per core)")
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", default=",".join(TARGETS))
    ap.add_argument("--all-variants", action="store_true")
    ap.add_argument("--full-build", action="store_true", help="also time a full build per arch")
    ap.add_argument("--write", action="store_true", help="append to benchmarks/RESULTS.md")
    args = ap.parse_args()
    archs = [a for a in args.archs.split(",") if a]
    with tempfile.TemporaryDirectory() as cache_dir:
        os.environ["PEERDSL_CACHE_DIR"] = cache_dir  # never touch the user's cache
        startup, rows = measure(archs, args.all_variants)
        builds = []
        if args.full_build:
            jobs = os.cpu_count() or 1
            for arch in archs:
                n, secs = full_build(arch, jobs)
                builds.append((arch, n, secs, jobs))
                print(f"full build {arch}: {n} kernels {secs:.1f} s", flush=True)
    text = report(startup, rows, builds)
    print(text)
    if args.write:
        path = os.path.join(ROOT, "benchmarks", "RESULTS.md")
        new = not os.path.exists(path)
        with open(path, "a") as f:
            if new:
                f.write("# Benchmark results\n\n")
            f.write("\n" + text)


if __name__ == "__main__":
    main()
