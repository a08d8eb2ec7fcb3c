"""Per-kernel resources of a gfx1250 build, read from the manifest (the code objects' own
metadata) and the ISA text beside each code object: VGPRs, SGPRs, LDS, scratch, spills and
the width of the global loads.

    python3 benchmarks/gfx1250_resources.py build/gfx1250/manifest.json
"""
from __future__ import annotations

import collections
import json
import os
import re
import sys

LOAD = re.compile(r"^\s*global_load_(b32|b64|b128|u8|i8|u16|i16|d16\w*)\b", re.M)


def rows(manifest_path: str) -> list[dict]:
    m = json.load(open(manifest_path))
    base = os.path.dirname(manifest_path)
    out = []
    for name, e in m["kernels"].items():
        isa = open(os.path.join(base, e["isa_file"])).read()
        loads = collections.Counter(LOAD.findall(isa))
        r = e["resources"]
        out.append({"op": e["op"], "constexprs": e["constexprs"], "vgpr": r["vgpr"],
                    "sgpr": r["sgpr"], "lds": e["lds_bytes"], "scratch": r["scratch_bytes"],
                    "spills": r["vgpr_spill"] + r["sgpr_spill"], "loads": dict(loads)})
    return out


def table(entries: list[dict]) -> str:
    lines = ["| op | variant | VGPR | SGPR | LDS B | scratch B | spills | global loads by width |",
             "|---|---|---|---|---|---|---|---|"]
    for e in sorted(entries, key=lambda e: (e["op"], json.dumps(e["constexprs"]))):
        cx = ", ".join(f"{k}={v}" for k, v in e["constexprs"].items() if k != "FP8")
        loads = ", ".join(f"{k} x{v}" for k, v in sorted(e["loads"].items()))
        lines.append(f"| {e['op']} | {cx} | {e['vgpr']} | {e['sgpr']} | {e['lds']} | "
                     f"{e['scratch']} | {e['spills']} | {loads} |")
    return "\n".join(lines)


def main() -> int:
    entries = rows(sys.argv[1] if len(sys.argv) > 1 else "build/gfx1250/manifest.json")
    picked = [e for e in entries if e["constexprs"].get("T", "bf16") == "bf16"
              and e["constexprs"].get("H", 6144) == 6144 and e["constexprs"].get("W", 4) == 4]
    print(table(picked))
    print(f"\nall {len(entries)} variants: max VGPR {max(e['vgpr'] for e in entries)}, "
          f"spills {sum(e['spills'] for e in entries)}, "
          f"scratch {sum(e['scratch'] for e in entries)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
