"""Static gfx1250 code quality of the shipped kernels beside the HIP references (issue 15
item 4): registers, scratch and spills from the code objects' metadata, and three counts
read from the ISA text:

  LL store waits   scope:SCOPE_SYS global_store_b128 followed by `s_wait_storecnt 0` before
                   the next memory instruction (a volatile store waits like that), of all such
                   stores (the LL lines are these stores)
  load burst       the most global_load_b128 issued back to back, with no s_wait_loadcnt
                   between them (the peers' packs or LL lines read before the first wait)
  barrier waits    block barriers next to an LDS access (the block reductions) whose waits
                   before s_barrier_signal include a global counter (loadcnt / storecnt), of
                   all such barriers; Signal barriers are not counted

    PYTHONPATH=. python3 -m peerdsl.cli build --arch gfx1250 \\
        --ops allreduce_ll,fused_ar_rms_1stage,fused_ar_rms_2stage,add_rmsnorm -o build
    reference/hip/build.sh --arch gfx1250 -o build/reference
    python3 benchmarks/gfx1250_codequality.py [--ours build/gfx1250/manifest.json]
        [--ref build/reference/gfx1250] [--all]

tests/test_isa_quality.py asserts on the same counts (it imports this file).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Iterator

_MEM = re.compile(r"^(global|flat|buffer|scratch|ds)_\w+")
_WAIT = re.compile(r"^s_wait_(\w+)")
_META = {"vgpr": ".vgpr_count", "sgpr": ".sgpr_count", "scratch": ".private_segment_fixed_size",
         "vgpr_spill": ".vgpr_spill_count", "sgpr_spill": ".sgpr_spill_count"}


# ----------------------------------------------------------------------------- ISA text

def instructions(body: str) -> list[str]:
    """The instruction lines of a kernel body, without comments, labels and directives."""
    out = []
    for line in body.splitlines():
        line = line.split(";")[0].split("//")[0].strip()
        if line and not line.startswith(".") and not line.endswith(":"):
            out.append(line)
    return out


def kernel_bodies(isa: str) -> dict[str, str]:
    """Kernel symbol -> the text from its label to its s_endpgm."""
    out = {}
    for m in re.finditer(r"^([A-Za-z_][\w.]*):[^\n]*\n(.*?^\s*s_endpgm)", isa, re.M | re.S):
        if not m.group(1).startswith("."):
            out[m.group(1)] = m.group(2)
    return out


def kernel_metadata(isa: str) -> dict[str, dict[str, int]]:
    """Kernel name -> registers, scratch and spills from the amdhsa.kernels metadata."""
    meta = isa[isa.find("amdhsa.kernels:"):]
    out = {}
    for entry in re.split(r"^  - ", meta, flags=re.M)[1:]:
        name = re.search(r"^\s+\.name:\s+(\S+)", entry, re.M)
        if not name:
            continue
        vals = {}
        for key, field in _META.items():
            m = re.search(rf"^\s+{re.escape(field)}:\s+(\d+)", entry, re.M)
            vals[key] = int(m.group(1)) if m else 0
        out[name.group(1)] = vals
    return out


def ll_store_waits(ins: list[str]) -> tuple[int, int]:
    """(SCOPE_SYS b128 stores followed by s_wait_storecnt 0 before the next memory op,
    all SCOPE_SYS b128 stores)."""
    waited = total = 0
    for i, line in enumerate(ins):
        if not (line.startswith("global_store_b128") and "scope:SCOPE_SYS" in line):
            continue
        total += 1
        for nxt in ins[i + 1:]:
            if _MEM.match(nxt):
                break
            if re.match(r"s_wait_storecnt(_dscnt)? 0x0\b", nxt):
                waited += 1
                break
    return waited, total


def max_load_burst(ins: list[str]) -> int:
    """The most global_load_b128 issued with no s_wait_loadcnt between them."""
    best = run = 0
    for line in ins:
        if line.startswith("global_load_b128"):
            run += 1
            best = max(best, run)
        elif re.match(r"s_wait_loadcnt", line):
            run = 0
    return best


def _barriers(ins: list[str]) -> Iterator[tuple[bool, list[str]]]:
    """(next to an LDS access, the waits before s_barrier_signal) for each block barrier."""
    for i, line in enumerate(ins):
        if not line.startswith("s_barrier_signal"):
            continue
        waits, before = [], None
        for prev in reversed(ins[:i]):
            if _MEM.match(prev) or prev.startswith("s_barrier"):
                before = prev
                break
            m = _WAIT.match(prev)
            if m:
                waits.append(m.group(1))
        after = next((n for n in ins[i + 1:] if _MEM.match(n) or n.startswith("s_barrier_signal")),
                     "")
        lds = (before or "").startswith("ds_") or after.startswith("ds_")
        yield lds and not _near_system_scope(ins, i), waits


def _near_system_scope(ins: list[str], i: int) -> bool:
    """A Signal's block barrier: a system-scope access (its arrival's release store, its
    poll) lies between the block barriers around it. It reads and writes its per-barrier
    verdicts in LDS too, but it must order global memory, so it is no reduction barrier."""
    for j in range(i - 1, -1, -1):
        if ins[j].startswith("s_barrier_wait"):
            break
        if "scope:SCOPE_SYS" in ins[j]:
            return True
    for j in range(i + 1, len(ins)):
        if ins[j].startswith("s_barrier_signal"):
            break
        if "scope:SCOPE_SYS" in ins[j]:
            return True
    return False


def barrier_global_waits(ins: list[str]) -> tuple[int, int]:
    """(LDS barriers whose waits include loadcnt or storecnt, all LDS barriers)."""
    lds = [w for near_lds, w in _barriers(ins) if near_lds]
    bad = sum(1 for w in lds if any("loadcnt" in x or "storecnt" in x for x in w))
    return bad, len(lds)


def stats(body: str, resources: dict[str, int]) -> dict[str, object]:
    ins = instructions(body)
    return {**{k: resources.get(k, 0) for k in _META},
            "ll_store_waits": ll_store_waits(ins), "load_burst": max_load_burst(ins),
            "barrier_waits": barrier_global_waits(ins)}


# ----------------------------------------------------------------------------- builds

def ours(manifest_path: str) -> dict[tuple, dict]:
    """(op, constexprs without FP8) -> stats, for the bf16 kernels of our build."""
    m = json.load(open(manifest_path))
    base = os.path.dirname(manifest_path)
    out = {}
    for name, e in m["kernels"].items():
        if e["constexprs"].get("T") != "bf16":
            continue
        isa = open(os.path.join(base, e["isa_file"])).read()
        body = kernel_bodies(isa).get(name, "")
        r = e["resources"]
        res = {"vgpr": r["vgpr"], "sgpr": r["sgpr"], "scratch": r["scratch_bytes"],
               "vgpr_spill": r["vgpr_spill"], "sgpr_spill": r["sgpr_spill"]}
        key = (e["op"], tuple((k, e["constexprs"][k]) for k in ("H", "W") if k in e["constexprs"]))
        out[key] = stats(body, res)
    return out


def reference(ref_dir: str) -> dict[tuple, dict]:
    """The same keys -> stats for the HIP reference kernels (bf16) in ref_dir/*.s."""
    out = {}
    if not os.path.isdir(ref_dir):
        return out
    for fn in sorted(os.listdir(ref_dir)):
        if not fn.endswith(".s"):
            continue
        isa = open(os.path.join(ref_dir, fn)).read()
        meta, bodies = kernel_metadata(isa), kernel_bodies(isa)
        for name, body in bodies.items():
            m = re.match(r"(\w+?)_bf16(?:_h(\d+))?_w(\d+)$", name)
            if m and name in meta:
                cx = (("H", int(m.group(2))),) if m.group(2) else ()
                out[(m.group(1), cx + (("W", int(m.group(3))),))] = stats(body, meta[name])
    return out


def _fmt(s: dict | None, key: str) -> str:
    if s is None:
        return "-"
    v = s[key]
    return f"{v[0]}/{v[1]}" if isinstance(v, tuple) else str(v)


def table(mine: dict, refs: dict, keys: list[tuple]) -> str:
    cols = ["vgpr", "sgpr", "scratch", "vgpr_spill", "ll_store_waits", "load_burst",
            "barrier_waits"]
    head = ["kernel", "VGPR", "SGPR", "scratch B", "spills", "LL store waits",
            "load burst", "barrier global waits", "VGPR / ref"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        label = key[0] + "".join(f" {k}={v}" for k, v in key[1])
        for who, s in (("DSL", mine.get(key)), ("HIP", refs.get(key))):
            if s is None:
                continue
            spills = s["vgpr_spill"] + s["sgpr_spill"]
            ratio = "-"
            if who == "DSL" and key in refs:
                ratio = f"{s['vgpr'] / refs[key]['vgpr']:.2f}"
            row = [f"{label} ({who})"] + [_fmt(s, c) for c in cols[:3]] + [str(spills)] + \
                  [_fmt(s, c) for c in cols[4:]] + [ratio]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


DEFAULT_KEYS = [("allreduce_ll", (("W", w),)) for w in (2, 4, 8)] + \
    [(op, (("H", h), ("W", w))) for op in ("fused_ar_rms_1stage", "fused_ar_rms_2stage")
     for h, w in ((6144, 4), (8192, 8))] + \
    [("add_rmsnorm", (("H", h),)) for h in (6144, 8192)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", default="build/gfx1250/manifest.json")
    ap.add_argument("--ref", default="build/reference/gfx1250")
    ap.add_argument("--all", action="store_true", help="every bf16 variant, not a selection")
    a = ap.parse_args()
    mine, refs = ours(a.ours), reference(a.ref)
    keys = sorted(mine) if a.all else [k for k in DEFAULT_KEYS if k in mine]
    print(table(mine, refs, keys))
    paired = [k for k in mine if k in refs]
    worst = max(paired, key=lambda k: mine[k]["vgpr"] / refs[k]["vgpr"], default=None)
    print(f"\n{len(mine)} bf16 kernels: max VGPR {max(s['vgpr'] for s in mine.values())}, "
          f"scratch {sum(s['scratch'] for s in mine.values())} B, spills "
          f"{sum(s['vgpr_spill'] + s['sgpr_spill'] for s in mine.values())}; "
          f"{len(paired)} with a reference"
          + (f", worst VGPR ratio {mine[worst]['vgpr'] / refs[worst]['vgpr']:.2f} ({worst[0]} "
             f"{dict(worst[1])})" if worst else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
