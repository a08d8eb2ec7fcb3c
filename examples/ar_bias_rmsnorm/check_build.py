"""Step 3 of the tutorial: build ar_bias_rmsnorm for gfx1250 and put it beside its HIP twin.

    python3 examples/ar_bias_rmsnorm/check_build.py [--arch gfx1250] [--constexpr T=bf16 --constexpr H=6144 --constexpr W=4]
    python3 examples/ar_bias_rmsnorm/check_build.py --all     # every variant: max VGPR, spills

Prints, for the DSL kernel and the HIP kernel of the same shape: VGPRs, SGPRs, LDS, scratch,
spills, code size and the instruction classes of the two ISA listings (what
`peerdsl compare ar_bias_rmsnorm --ref ar_bias_rmsnorm.hip --arch gfx1250` reports).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
HIP = HERE / "ar_bias_rmsnorm.hip"
sys.path.insert(0, str(HERE))
from ar_bias_rmsnorm import ar_bias_rmsnorm, variants  # noqa: E402

# the flags of the project's reference builds: no a*b+c contraction (the DSL never fuses)
CLANG_FLAGS = ["-x", "hip", "-std=c++17", "--cuda-device-only", "-nogpulib", "-nogpuinc",
               "-O3", "-ffp-contract=off", "--no-gpu-bundle-output"]


def compile_dsl(target: str, **constexprs) -> types.SimpleNamespace:
    """The DSL kernel compiled for `target`: .name .code .isa .resources .lds_bytes ..."""
    import peerdsl
    return peerdsl.compile(ar_bias_rmsnorm, target, **constexprs)


def find_clang() -> str | None:
    return shutil.which(os.environ.get("PEERDSL_CLANG", "clang++-22"))


def compile_hip(out_dir: Path, arch: str = "gfx1250") -> tuple[Path, str]:
    """(code object, ISA text) of ar_bias_rmsnorm.hip built with clang-22 for `arch`."""
    clang = find_clang()
    if clang is None:
        raise RuntimeError("clang++-22 is not on PATH (apt-get install clang-22 lld-22, or set "
                           "PEERDSL_CLANG)")
    from peerdsl.reference_build import include_flags  # ref_common.h ships with peerdsl
    flags = CLANG_FLAGS + [f"--offload-arch={arch}"] + include_flags(HIP)
    hsaco, asm = out_dir / "ar_bias_rmsnorm.hsaco", out_dir / "ar_bias_rmsnorm.s"
    for extra, dst in (([], hsaco), (["-S"], asm)):
        p = subprocess.run([clang, *flags, *extra, str(HIP), "-o", str(dst)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"clang failed on {HIP}:\n{p.stderr}")
    return hsaco, asm.read_text()


def code_size(code: bytes, symbol: str) -> int:
    """Bytes of `symbol`'s machine code (its ELF symbol's size; a HIP file holds many)."""
    import io

    from elftools.elf.elffile import ELFFile
    symtab = ELFFile(io.BytesIO(code)).get_section_by_name(".symtab")
    sizes = [s["st_size"] for s in symtab.iter_symbols() if s.name == symbol
             and s["st_info"]["type"] == "STT_FUNC"]
    return sizes[0] if sizes else 0


def amd_side(code: bytes, isa: str, symbol: str) -> dict:
    """Resources from the code object's metadata note, instruction classes from the ISA."""
    # the rows `peerdsl compare ar_bias_rmsnorm --ref FILE.hip
    #             --arch gfx1250 --constexpr T=bf16 --constexpr H=6144 --constexpr W=4` (one row per side)
    from peerdsl.isa_stats import count_amd, function_lines
    from peerdsl.lowering.codeobject import read_amd
    info = read_amd(code, symbol)
    r = info.resources
    row = {"kernel": symbol, "mach": hex(info.mach), "VGPRs": r["vgpr"], "SGPRs": r["sgpr"],
           "LDS bytes": info.lds_bytes, "scratch bytes": r["scratch_bytes"],
           "spills": r["vgpr_spill"] + r["sgpr_spill"], "code bytes": code_size(code, symbol)}
    row.update(count_amd(function_lines(isa, symbol)))
    return row


def parse_constexprs(items: list[str]) -> dict:
    out: dict = {"T": "bf16", "H": 6144, "W": 4}
    for item in items:
        k, _, v = item.partition("=")
        out[k] = int(v) if v.isdigit() else v
    return out


def side_by_side(cx: dict, arch: str) -> str:
    dsl = compile_dsl(arch, **cx)
    rows = [("DSL", amd_side(dsl.code, dsl.isa, dsl.name))]
    if cx["T"] == "bf16" and find_clang():
        with tempfile.TemporaryDirectory() as d:
            hsaco, asm = compile_hip(Path(d), arch)
            sym = f"ar_bias_rmsnorm_bf16_h{cx['H']}_w{cx['W']}"
            rows.append(("HIP", amd_side(hsaco.read_bytes(), asm, sym)))
    # every row either side has (an instruction class one listing lacks counts 0 there)
    keys = list(dict.fromkeys(k for _, r in rows for k in r))
    lines = [f"{'':24}" + "".join(f"{name:>32}" for name, _ in rows)]
    lines += [f"{k:24}" + "".join(f"{str(r.get(k, 0)):>32}" for _, r in rows) for k in keys]
    return "\n".join(lines)


def all_variants(arch: str) -> str:
    lines, worst = [], (0, None)
    for cx in variants(arch):
        k = compile_dsl(arch, **cx)
        r = k.resources
        spills = r["vgpr_spill"] + r["sgpr_spill"]
        worst = max(worst, (r["vgpr"], str(cx)), key=lambda x: x[0])
        lines.append(f"{str(cx['T']):5} H={cx['H']:5} W={cx['W']}: VGPR {r['vgpr']:3} SGPR "
                     f"{r['sgpr']:3} LDS {k.lds_bytes} scratch {r['scratch_bytes']} "
                     f"spills {spills}")
    lines.append(f"max VGPR {worst[0]} ({worst[1]})")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="gfx1250")
    ap.add_argument("--constexpr", nargs="*", default=[], metavar="K=V")
    ap.add_argument("--all", action="store_true", help="every variant's resources")
    a = ap.parse_args()
    print(all_variants(a.arch) if a.all else side_by_side(parse_constexprs(a.constexpr), a.arch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
