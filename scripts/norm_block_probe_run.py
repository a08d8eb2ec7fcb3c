"""Time every thread mapping that scripts/norm_block_probe_build.py built, with all W ranks'
kernels at once (benchmarks/ncu_ar_one_rank.py --all-ranks: the HBM traffic of W ranks
sharing the GPU, no waits), beside the Triton add + RMSNorm on the same bytes; `--rounds`
interleaved rounds, one process (device call M1, 2026-12-06).

    PYTHONPATH=. python3 scripts/norm_block_probe_run.py --build build_probe --hidden 2880
"""
from __future__ import annotations

import argparse
import contextlib
import io

from benchmarks.ncu_ar_one_rank import main as one_rank

MAPPINGS = ((256, 4), (384, 4), (384, 5), (192, 6), (512, 3), (512, 4))


def parse_mappings(pairs: list[str] | None) -> list[tuple[int, int]]:
    """["448:2", ...] -> [(448, 2), ...] (no MLIR here: the GPU machine runs this file)"""
    return [tuple(int(v) for v in p.split(":")) for p in pairs or ()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build_probe")
    ap.add_argument("--hidden", type=int, default=2880)
    ap.add_argument("--mappings", nargs="*", metavar="B:M",
                    help="the (threads, blocks per SM) pairs (default: MAPPINGS)")
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--rows", type=int, nargs="*", default=[4096, 1024, 256])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    common = ["--build", args.build, "--world", str(args.world), "--hidden", str(args.hidden),
              "--all-ranks"]
    for rnd in range(args.rounds):
        for rows in args.rows:
            runs = [("triton", [])] + [(p, [f"B={b}", f"M={m}"]) for p in ("norm", "gather")
                                       for b, m in parse_mappings(args.mappings) or MAPPINGS]
            for path, cx in runs:
                buf = io.StringIO()
                with contextlib.redirect_stdout(buf):
                    rc = one_rank(common + ["--rows", str(rows), "--path", path]
                                  + (["--cx", *cx] if cx else []))
                print(f"round {rnd} rc={rc} {buf.getvalue().strip()}", flush=True)


if __name__ == "__main__":
    main()
