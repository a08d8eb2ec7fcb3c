"""Instruction classes counted from ISA text, and AMD occupancy from a kernel's resources.

Pure text and arithmetic (no MLIR, no ELF reader), so anything holding an assembly listing
can use it: `peerdsl compare` puts a DSL kernel beside a HIP one with it.

- AMD assembly as clang -S, the DSL's .s (MLIR format=isa) or `llvm-objdump -d` print it,
  gfx12 spellings (global_load_b128, s_wait_loadcnt) and gfx9 ones (global_load_dwordx4,
  s_waitcnt vmcnt(0)). gfx9 widths are reported in the gfx12 spelling (dwordx4 -> b128).
- NVIDIA PTX. Generic-address ld/st count as global: the HIP reference compiled by nvcc uses
  generic pointers where the DSL's are global, and ptxas resolves both to global.

Counts are a dict of row -> int. A row is a group ("global loads") or a group's child
("global loads|global_load_b128"): every instruction falls in exactly one group, so the
groups sum to "instructions"; children break a group down (a gfx9 `s_waitcnt vmcnt(0)
lgkmcnt(0)` counts once in "waits" and once in each of its two kinds). `merged_rows` orders
the rows of several listings for one table.
"""
from __future__ import annotations

import collections
import re
from typing import Iterable

TOTAL = "instructions"
CONTROL = "control (s_nop, s_clause...)"  # s_nop, s_clause, s_delay_alu, s_endpgm, s_sleep ...
AMD_GROUPS = ("global loads", "global stores", "other vector memory", "scalar loads", "atomics",
              "LDS (ds_*)", "cache wb/inv", "waits", "barriers", "branches", "VALU (v_*)",
              "SALU (s_*)", CONTROL, "other")
PTX_GROUPS = ("global loads", "global stores", "param loads", "shared ld/st", "local ld/st",
              "atomics", "fences", "waits", "barriers", "branches", "other")
# children always shown for these groups (the widths a reader compares first)
CORE_CHILDREN = {
    "global loads": ("global_load_b32", "global_load_b64", "global_load_b128",
                     "ld.global.b32", "ld.global.b64", "ld.global.b128"),
    "global stores": ("global_store_b32", "global_store_b64", "global_store_b128",
                      "st.global.b32", "st.global.b64", "st.global.b128"),
}

# ----------------------------------------------------------------------------- listings
_OBJDUMP_FUNC = re.compile(r"^[0-9a-f]+ <([^>]+)>:$")


def function_lines(text: str, symbol: str) -> list[str]:
    """The lines of `symbol`'s body in an AMD listing (clang -S, the DSL's .s, or objdump)."""
    lines = text.splitlines()
    start = None
    for i, ln in enumerate(lines):
        s = ln.split(";", 1)[0].strip()  # clang -S writes "sym:  ; @sym"
        if s == f"{symbol}:" or s.endswith(f"<{symbol}>:"):
            start = i + 1
            break
    if start is None:
        raise KeyError(f"no function {symbol!r} in the ISA text (kernels there: "
                       f"{kernel_names(text)})")
    out = []
    for ln in lines[start:]:
        s = ln.strip()
        # clang -S ends a function with .Lfunc_endN:; objdump starts the next with <sym>:
        if s.startswith(".Lfunc_end") or s.startswith(".size") or _OBJDUMP_FUNC.match(s):
            break
        out.append(ln)
    return out


def ptx_function(text: str, symbol: str) -> list[str]:
    """The lines of the PTX `.entry symbol` (parameters and body)."""
    m = re.search(rf"\.entry\s+{re.escape(symbol)}\s*\((.*?)^\}}", text, re.S | re.M)
    if not m:
        raise KeyError(f"no .entry {symbol!r} in the PTX (entries there: {kernel_names(text)})")
    return m.group(0).splitlines()


def kernel_names(text: str) -> list[str]:
    """The kernels an AMD listing (.amdhsa_kernel NAME) or a PTX module (.entry NAME) holds."""
    names = re.findall(r"^\s*\.amdhsa_kernel\s+(\S+)", text, re.M)
    names += re.findall(r"\.entry\s+([A-Za-z_$][\w$]*)\s*\(", text)
    return list(dict.fromkeys(names))


# ----------------------------------------------------------------------------- AMD
_GFX9_WIDTH = {"dword": "b32", "dwordx2": "b64", "dwordx3": "b96", "dwordx4": "b128",
               "ubyte": "u8", "sbyte": "i8", "ushort": "u16", "sshort": "i16", "byte": "b8",
               "short": "b16"}
_AMD_BRANCH = re.compile(r"^s_(branch|cbranch_\w+|setpc_b64|swappc_b64|call_b64|getpc_b64|"
                         r"rfe_b64)$")
_AMD_CONTROL = re.compile(r"^s_(nop|delay_alu|clause|endpgm\w*|sleep\w*|setprio\w*|sendmsg\w*|"
                          r"trap|code_end|inst_prefetch|set_inst_prefetch_distance|"
                          r"ttracedata\w*|icache_inv|singleuse_vdst|version|setkill|"
                          r"wakeup\w*|nop_\w+)$")
_AMD_CACHE = re.compile(r"^(global_(wb|inv|wbinv)\w*|buffer_(wbl2|inv|gl0_inv|gl1_inv|"
                        r"wbinvl1\w*)|s_dcache_\w+|s_gl1_inv)$")
_WAITCNT_FIELD = re.compile(r"\b(vmcnt|expcnt|lgkmcnt|vscnt)\(")


def _amd_mnemonic(line: str) -> tuple[str, str] | None:
    """(mnemonic, operands) of an assembly line; None for labels, directives, comments."""
    s = line.split(";", 1)[0].split("//", 1)[0].strip()
    if not s or s.startswith(".") or s.endswith(":") or _OBJDUMP_FUNC.match(s):
        return None
    parts = s.split(None, 1)
    return parts[0], parts[1] if len(parts) > 1 else ""


def _gfx12_width(mnemonic: str) -> str:
    """global_load_dwordx4 -> global_load_b128 (gfx12 spelling); gfx12 names unchanged."""
    head, _, tail = mnemonic.rpartition("_")
    return f"{head}_{_GFX9_WIDTH[tail]}" if tail in _GFX9_WIDTH else mnemonic


def _amd_classify(m: str, ops: str) -> tuple[str, list[str]]:
    """(group, children) of one AMD instruction."""
    if re.match(r"^(global|flat|buffer|scratch)_atomic_", m) or m.startswith("global_atomic"):
        return "atomics", [m]
    if m.startswith("global_load"):
        return "global loads", [_gfx12_width(m)]
    if m.startswith("global_store"):
        return "global stores", [_gfx12_width(m)]
    if _AMD_CACHE.match(m):
        return "cache wb/inv", [m]
    if re.match(r"^(flat|buffer|scratch|image|tbuffer|global|tensor)_", m):
        return "other vector memory", [_gfx12_width(m)]
    if m.startswith("ds_"):
        return "LDS (ds_*)", []
    if re.match(r"^s_(buffer_)?(load|prefetch)", m):
        return "scalar loads", [_gfx12_width(m)]
    if m.startswith("s_wait"):
        fields = _WAITCNT_FIELD.findall(ops) if m == "s_waitcnt" else []
        # s_waitcnt 0 (all counters) or a bare immediate: name it as written
        kids = [f"s_waitcnt {f}" for f in fields] or [m if m != "s_waitcnt" else "s_waitcnt imm"]
        return "waits", kids
    if m.startswith("s_barrier"):
        return "barriers", [m]
    if _AMD_BRANCH.match(m):
        return "branches", []
    if _AMD_CONTROL.match(m):
        return CONTROL, []
    if m.startswith("v_"):
        return "VALU (v_*)", []
    if m.startswith("s_"):
        return "SALU (s_*)", []
    return "other", [m]


def count_amd(lines: Iterable[str]) -> dict[str, int]:
    """Instruction classes of an AMD function body (see the module docstring)."""
    counts: collections.Counter = collections.Counter()
    for ln in lines:
        parsed = _amd_mnemonic(ln)
        if parsed is None:
            continue
        group, kids = _amd_classify(*parsed)
        counts[TOTAL] += 1
        counts[group] += 1
        for k in kids:
            counts[f"{group}|{k}"] += 1
    return _with_core(counts, AMD_GROUPS, "global_")


# ----------------------------------------------------------------------------- PTX
_PTX_MEM = re.compile(r"^(ld|st)((?:\.[a-z0-9_:]+)*)$")
_PTX_BITS = re.compile(r"\.[busf](8|16|32|64|128)\b")


def _ptx_width(mods: str) -> int:
    vec = 4 if ".v4" in mods else 2 if ".v2" in mods else 8 if ".v8" in mods else 1
    bits = _PTX_BITS.findall(mods)
    return vec * int(bits[-1]) if bits else 0


def _ptx_statements(lines: Iterable[str]) -> Iterable[str]:
    for ln in lines:
        for stmt in ln.split("//", 1)[0].replace("{", " ").replace("}", " ").split(";"):
            s = stmt.strip()
            if s.startswith("@"):  # a predicate guard: the instruction follows it
                s = s.split(None, 1)[1] if " " in s else ""
            if not s or s.startswith(".") or s.endswith(":") or s.startswith("$"):
                continue
            if re.match(r"^[a-z]", s):
                yield s


_PTX_ATOM_OPS = {"add", "cas", "exch", "min", "max", "inc", "dec", "and", "or", "xor"}
_PTX_SEMS = {"relaxed", "acquire", "release", "acq_rel", "sc", "volatile"}
_PTX_SCOPES = {"cta", "cluster", "gpu", "sys"}


def _ptx_atomic_kind(op: str) -> str:
    """atom.acq_rel.sys.global.cas.b32 and atom.cas.acq_rel.sys.b32 -> atom.cas.acq_rel.sys:
    nvcc and the DSL order the modifiers differently; types and spaces are dropped."""
    head, *mods = op.split(".")
    pick = [next((m for m in mods if m in group), "") for group in
            (_PTX_ATOM_OPS, _PTX_SEMS, _PTX_SCOPES)]
    return ".".join([head, *(p for p in pick if p)])


def _ptx_classify(op: str) -> tuple[str, list[str]]:
    m = _PTX_MEM.match(op)
    if m:
        kind, mods = m.groups()
        for space, group in (("param", "param loads"), ("shared", "shared ld/st"),
                             ("local", "local ld/st"), ("const", "param loads")):
            if re.search(rf"\.{space}\b", mods):
                return group, []
        width = _ptx_width(mods)
        return ("global loads" if kind == "ld" else "global stores"), [f"{kind}.global.b{width}"]
    if op.startswith(("atom.", "red.")):
        return "atomics", [_ptx_atomic_kind(op)]
    if op.startswith(("fence", "membar")):
        return "fences", [op]
    if op.startswith(("mbarrier.try_wait", "mbarrier.test_wait", "cp.async.wait",
                      "cp.async.bulk.wait", "nanosleep")):
        return "waits", [op.split(".b64")[0]]
    if op.startswith(("bar.", "barrier")):
        return "barriers", [op]
    if op.startswith(("bra", "brx", "call", "ret", "exit")):
        return "branches", []
    return "other", []


def count_ptx(lines: Iterable[str]) -> dict[str, int]:
    """Instruction classes of a PTX entry (see the module docstring)."""
    counts: collections.Counter = collections.Counter()
    for s in _ptx_statements(lines):
        group, kids = _ptx_classify(s.split()[0])
        counts[TOTAL] += 1
        counts[group] += 1
        for k in kids:
            counts[f"{group}|{k}"] += 1
    return _with_core(counts, PTX_GROUPS, "global.")


def _with_core(counts: collections.Counter, groups: tuple[str, ...], core: str) -> dict[str, int]:
    out = {TOTAL: counts.get(TOTAL, 0)}
    for g in groups:
        out[g] = counts.get(g, 0)
        kids = [k for k in CORE_CHILDREN.get(g, ()) if core in k]
        kids += sorted((k.split("|", 1)[1] for k in counts if k.startswith(f"{g}|")
                        and k.split("|", 1)[1] not in kids), key=_natural)
        out.update({f"{g}|{k}": counts.get(f"{g}|{k}", 0) for k in kids})
    return out


def _natural(name: str) -> list:
    """s_load_b32 before s_load_b128: digit runs compare as numbers."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def merged_rows(*stats: dict[str, int]) -> list[str]:
    """The row keys of several count dicts in one table order: groups in their order, each
    group's children (always-shown widths first, then the rest by name) under it."""
    groups = list(dict.fromkeys(k.split("|", 1)[0] for s in stats for k in s))
    kids: dict[str, set[str]] = {g: set() for g in groups}
    for s in stats:
        for k in s:
            if "|" in k:
                g, c = k.split("|", 1)
                kids[g].add(c)
    out = []
    for g in groups:
        core = [c for c in CORE_CHILDREN.get(g, ()) if c in kids[g]]
        out += [g] + [f"{g}|{c}" for c in core + sorted(kids[g] - set(core), key=_natural)]
    return out


def row_label(key: str) -> str:
    """How a row key reads in a table: children indented under their group."""
    return f"  {key.split('|', 1)[1]}" if "|" in key else key


# ----------------------------------------------------------------------------- occupancy
# Per-target facts (LLVM AMDGPU): waves per SIMD at most, VGPRs per lane of one SIMD and
# their allocation granule, LDS per CU (gfx9) or WGP (gfx12), SIMDs sharing that LDS.
_AMD_FACTS = {  # arch: (max waves/SIMD, VGPR file, VGPR granule, LDS bytes, SIMDs, gfx9 SGPR rule)
    "gfx1250": (16, 1024, 16, 327680, 4, False),
    "gfx950": (8, 512, 8, 163840, 4, True),
    "gfx942": (8, 512, 8, 65536, 4, True),
}


def amd_occupancy(arch: str, vgprs: int, sgprs: int, lds_bytes: int, block_size: int,
                  wave_size: int) -> int:
    """Waves per SIMD a kernel can keep resident: the least of its VGPR, SGPR (gfx9 only; on
    gfx10+ SGPRs never limit) and LDS limits, as the compiler reports it (clang -S's
    "; Occupancy:" line; tests/test_isa_stats.py checks the two agree)."""
    if arch not in _AMD_FACTS:
        raise KeyError(f"no occupancy facts for {arch!r} (have {sorted(_AMD_FACTS)})")
    max_waves, vgpr_file, granule, lds_total, simds, gfx9_sgprs = _AMD_FACTS[arch]
    waves = max_waves
    used = -(-max(vgprs, 1) // granule) * granule
    waves = min(waves, max(vgpr_file // used, 1))
    if gfx9_sgprs:
        waves = min(waves, 10 if sgprs <= 80 else 9 if sgprs <= 88 else 8 if sgprs <= 100 else 7)
    if lds_bytes > 0:
        waves_per_group = -(-block_size // wave_size)
        # groups a CU/WGP holds: wave slots, and one hardware barrier per multi-wave group
        slots = max_waves * simds
        cap = slots if waves_per_group == 1 else min(slots // waves_per_group,
                                                     16 if gfx9_sgprs else 32)
        groups = min(lds_total // lds_bytes, cap)
        waves = min(waves, max(-(-groups * waves_per_group // simds), 1))  # rounded up
    return waves
