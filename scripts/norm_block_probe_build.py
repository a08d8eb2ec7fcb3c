"""Build add_rmsnorm and fused_ar_rms_gather at one hidden size for sm_90 with several thread
mappings (B threads per row, M blocks per SM) into one build directory, for a side-by-side
timing of the mappings (device call M1, 2026-12-06: `benchmarks/ncu_ar_one_rank.py --cx`).

    python scripts/norm_block_probe_build.py --hidden 2880 --out build_probe
"""
from __future__ import annotations

import argparse
import dataclasses

from peerdsl.lowering.build import build, resolve_target
from peerdsl.ops.registry import load_all
from scripts.norm_block_probe_run import parse_mappings

MAPPINGS = ((256, 4), (384, 4), (384, 5), (192, 6), (192, 8), (128, 8), (128, 12),
            (512, 3), (512, 4), (96, 16))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--mappings", nargs="*", metavar="B:M",
                    help="the (threads, blocks per SM) pairs (default: MAPPINGS)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--out", default="build_probe")
    args = ap.parse_args()
    t = resolve_target("sm_90")
    base = {"T": "bf16", "H": args.hidden, "FP8": t.fp8_format, "R": t.row_reads_ahead}
    reg = load_all()
    maps = parse_mappings(args.mappings) or MAPPINGS
    probe = {"add_rmsnorm": [{**base, "B": b, "M": m} for b, m in maps],
             "fused_ar_rms_gather": [{**base, "W": args.world, "B": b, "M": m}
                                     for b, m in maps]}
    for op, vs in probe.items():
        reg[op] = dataclasses.replace(reg[op], variants=lambda target, vs=vs: vs)
    m = build("sm_90", list(probe), args.out)
    for k in m["kernels"].values() if isinstance(m["kernels"], dict) else m["kernels"]:
        r = k.get("resources", {})
        print(k["op"], {c: k["constexprs"][c] for c in ("B", "M")}, r)


if __name__ == "__main__":
    main()
