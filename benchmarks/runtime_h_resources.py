"""Registers and spills of the runtime-H row kernels beside the specialized ones (issue 15
item 5), read from a build's manifest: for every specialized hidden size H, the specialized
kernel and the runtime-H variant of the smallest bound MAXH >= H (what a launch at H takes
when the specialized one is not built, or with PEERDSL_FORCE_RUNTIME_H=1).

    peerdsl build --arch gfx1250,sm_90 --ops all -o build
    python3 benchmarks/runtime_h_resources.py build/gfx1250/manifest.json build/sm_90/manifest.json
"""
from __future__ import annotations

import json
import sys

from peerdsl.ops._rows import runtime_class
from peerdsl.runtime.built import RUNTIME_H_OPS


def regs(resources: dict) -> tuple[int, int, int]:
    """(registers, spilled, scratch bytes): VGPRs on AMD, registers on sm_90."""
    if "vgpr" in resources:
        return (resources["vgpr"], resources["vgpr_spill"] + resources["sgpr_spill"],
                resources["scratch_bytes"])
    return (resources["registers"], resources["spill_stores"] + resources["spill_loads"],
            resources["local_bytes"] + resources["stack_bytes"])


def compare(manifest_path: str) -> list[str]:
    m = json.load(open(manifest_path))
    by_op: dict[str, list[dict]] = {}
    for e in m["kernels"].values():
        by_op.setdefault(e["op"], []).append(e)
    kind = "VGPR" if m.get("arch", "").startswith("gfx") else "regs"
    lines = [f"## {m.get('arch', manifest_path)}", "",
             f"| op | T | W | H | specialized {kind} | runtime-H MAXH | runtime-H {kind} | "
             "spills (spec/rt) | scratch B (spec/rt) |", "|---|---|---|---|---|---|---|---|---|"]
    for op, rt_op in RUNTIME_H_OPS.items():
        runtime = {(e["constexprs"]["T"], e["constexprs"].get("W"), e["constexprs"]["MAXH"]): e
                   for e in by_op.get(rt_op, ())}
        bounds = sorted({k[2] for k in runtime})
        for e in sorted(by_op.get(op, ()), key=lambda e: (e["constexprs"]["T"],
                                                         e["constexprs"].get("W", 0),
                                                         e["constexprs"]["H"])):
            c = e["constexprs"]
            bound = runtime_class(c["H"], tuple(bounds))
            r = runtime.get((c["T"], c.get("W"), bound))
            if r is None:
                continue
            (sv, ss, sx), (rv, rs, rx) = regs(e["resources"]), regs(r["resources"])
            lines.append(f"| {op} | {c['T']} | {c.get('W', '-')} | {c['H']} | {sv} | {bound} | "
                         f"{rv} | {ss}/{rs} | {sx}/{rx} |")
    worst = [regs(e["resources"]) for rt_op in RUNTIME_H_OPS.values() for e in by_op.get(rt_op, ())]
    if worst:
        lines += ["", f"all {len(worst)} runtime-H variants: max {kind} "
                  f"{max(w[0] for w in worst)}, spills {sum(w[1] for w in worst)}, "
                  f"scratch {sum(w[2] for w in worst)} bytes"]
    return lines


def main() -> int:
    for path in sys.argv[1:] or ["build/gfx1250/manifest.json"]:
        print("\n".join(compare(path)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
