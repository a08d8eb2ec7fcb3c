"""`peerdsl bench`: SPEC section 8's benchmark (benchmarks/bench_ar_rms.py) on a GPU machine."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

HELP = "run SPEC section 8's benchmark table on the GPU (needs a GPU and an sm_90 build)"


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--build", default="build")
    p.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    p.add_argument("--hidden", type=int, nargs="+", default=[6144])


def run(args: argparse.Namespace) -> int:
    import torch
    if not torch.cuda.is_available():
        print("peerdsl bench needs a GPU (none is visible); the simulator is not a timing model")
        return 2
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "bench_ar_rms.py")
    return subprocess.call([sys.executable, script, "--build", args.build, "--tp",
                            *map(str, args.tp), "--hidden", *map(str, args.hidden)])
