"""Build hand-written HIP kernels (reference/hip/*.hip, or any user .hip file) ahead of time.

AMD (gfx1250, gfx950, gfx942) with Debian's clang-22 (`-x hip --cuda-device-only -nogpulib
-nogpuinc`, our own hip_min.h instead of ROCm's headers); sm_90 with nvcc through
hip_to_cuda.h. The headers (ref_common.h, hip_min.h, hip_to_cuda.h) ship inside the package
(peerdsl/reference/include) and are always on the include path, so `#include "ref_common.h"`
works from any directory without CPATH. Outputs per target under OUT/<arch>/:

    AMD:    <stem>.hsaco (code object) and <stem>.s (clang -S, the ISA text we count)
    NVIDIA: <stem>.cubin, <stem>.ptx and <stem>.ptxas.log (`ptxas -v`, the resources)

Idempotent: a stamp beside the outputs holds a hash of the sources, headers, flags and
compiler version; a matching stamp means nothing is rebuilt.

    python -m peerdsl.reference_build [--arch gfx1250,gfx942,sm_90] [-o build/reference]
                                      [-I DIR] [FILE.hip ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from . import layout

REPO = Path(__file__).resolve().parent.parent
REF_DIR = REPO / "reference" / "hip"
INCLUDE_DIR = Path(__file__).resolve().parent / "reference" / "include"  # package data
DEFAULT_OUT = Path("build") / "reference"
AMD_ARCHS = ("gfx1250", "gfx950", "gfx942")
NVIDIA_ARCHS = ("sm_90",)
# No a*b+c contraction anywhere: the DSL emits separate mul and add (SPEC 2 is exact).
CLANG_FLAGS = ["-x", "hip", "-std=c++17", "--cuda-device-only", "-nogpulib", "-nogpuinc",
               "-O3", "-ffp-contract=off", "--no-gpu-bundle-output"]
NVCC_FLAGS = ["-arch=sm_90", "-O3", "--fmad=false", "-std=c++17", "-x", "cu"]


class ReferenceBuildError(RuntimeError):
    """A compiler is missing or failed."""


@dataclasses.dataclass(frozen=True)
class RefArtifacts:
    arch: str
    source: Path
    code_object: Path     # .hsaco or .cubin
    isa: Path             # .s (AMD) or .ptx (NVIDIA)
    ptxas_log: Path | None = None


def layout_defines() -> list[str]:
    """The Signal layout from layout.py, so the C++ cannot drift from the DSL's."""
    names = ("MAX_RANKS", "MAX_BLOCKS", "SIG_SLOTS", "SIG_EPOCH", "SIG_LL_EPOCH",
             "SIG_SPIN_LIMIT", "SIG_ERROR")
    return [f"-DREF_{n}={getattr(layout, n)}" for n in names]


def find_clang() -> str | None:
    """clang++ that knows gfx1250: $PEERDSL_CLANG, else clang++-22 on PATH."""
    for cand in (os.environ.get("PEERDSL_CLANG"), "clang++-22"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def find_nvcc() -> str | None:
    cand = os.environ.get("PEERDSL_NVCC") or "nvcc"
    return shutil.which(cand)


def missing_reason(arch: str) -> str | None:
    """Why the reference cannot be built for `arch` here (None when it can)."""
    if arch in AMD_ARCHS:
        return None if find_clang() else (
            "clang-22 is not installed (apt-get install -y clang-22 lld-22 llvm-22; "
            "bookworm-security has them), or set PEERDSL_CLANG")
    if arch in NVIDIA_ARCHS:
        return None if find_nvcc() else (
            "nvcc (the CUDA toolkit) is not on PATH, or set PEERDSL_NVCC: the sm_90 reference "
            "is compiled from HIP through hip_to_cuda.h, which needs nvcc; the ptxas of the "
            "nvidia-cuda-nvcc-cu12 package alone cannot compile C++")
    return f"unknown reference arch {arch!r} (have {AMD_ARCHS + NVIDIA_ARCHS})"


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise ReferenceBuildError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    return p


def _version(tool: str) -> str:
    try:
        return subprocess.run([tool, "--version"], capture_output=True, text=True).stdout
    except OSError:
        return ""


def include_flags(src: Path, include_dirs: tuple[Path, ...] = ()) -> list[str]:
    """-I for the source's own directory, the caller's directories, then the package's
    headers (last, so a user's own ref_common.h beside the source wins)."""
    dirs = [src.parent, *(Path(d).resolve() for d in include_dirs), INCLUDE_DIR]
    return [f"-I{d}" for d in dict.fromkeys(dirs)]


def _stamp(src: Path, tool: str, flags: list[str]) -> str:
    """Hash of everything the outputs depend on: the source, every header in its include
    directories (they include each other), the flags and the compiler's version text."""
    h = hashlib.sha256()
    headers = [f for flag in flags if flag.startswith("-I")
               for f in sorted(Path(flag[2:]).glob("*.h"))]
    for f in [src] + headers:
        h.update(str(f).encode() + b"\0" + f.read_bytes())
    h.update("\0".join(flags + [_version(tool)]).encode())
    return h.hexdigest()


def _fresh(stamp_file: Path, stamp: str, outputs: list[Path]) -> bool:
    return (stamp_file.exists() and stamp_file.read_text() == stamp
            and all(p.exists() for p in outputs))


def build_amd(src: Path, arch: str = "gfx1250", out: Path = DEFAULT_OUT,
              include_dirs: tuple[Path, ...] = ()) -> RefArtifacts:
    clang = find_clang()
    if clang is None:
        raise ReferenceBuildError(missing_reason(arch) or "no clang")
    src, d = _source(src), Path(out) / arch
    flags = (CLANG_FLAGS + [f"--offload-arch={arch}"] + include_flags(src, include_dirs)
             + layout_defines())
    art = RefArtifacts(arch, src, d / f"{src.stem}.hsaco", d / f"{src.stem}.s")
    stamp, stamp_file = _stamp(src, clang, flags), d / f"{src.stem}.stamp"
    if _fresh(stamp_file, stamp, [art.code_object, art.isa]):
        return art
    d.mkdir(parents=True, exist_ok=True)
    _run([clang, *flags, str(src), "-o", str(art.code_object)])
    _run([clang, *flags, "-S", str(src), "-o", str(art.isa)])
    stamp_file.write_text(stamp)
    return art


def build_nvidia(src: Path, arch: str = "sm_90", out: Path = DEFAULT_OUT,
                 include_dirs: tuple[Path, ...] = ()) -> RefArtifacts:
    nvcc = find_nvcc()
    if nvcc is None:
        raise ReferenceBuildError(missing_reason(arch) or "no nvcc")
    src, d = _source(src), Path(out) / arch
    flags = NVCC_FLAGS + include_flags(src, include_dirs) + layout_defines()
    art = RefArtifacts(arch, src, d / f"{src.stem}.cubin", d / f"{src.stem}.ptx",
                       d / f"{src.stem}.ptxas.log")
    stamp, stamp_file = _stamp(src, nvcc, flags), d / f"{src.stem}.stamp"
    if _fresh(stamp_file, stamp, [art.code_object, art.isa, art.ptxas_log]):
        return art
    d.mkdir(parents=True, exist_ok=True)
    p = _run([nvcc, "-cubin", *flags, "-Xptxas", "-v", str(src), "-o", str(art.code_object)])
    art.ptxas_log.write_text(p.stdout + p.stderr)  # ptxas -v reports on stderr
    _run([nvcc, "-ptx", *flags, str(src), "-o", str(art.isa)])
    stamp_file.write_text(stamp)
    return art


def _source(src: Path) -> Path:
    src = Path(src).resolve()
    if not src.is_file():
        raise ReferenceBuildError(f"reference source {src} does not exist")
    return src


def build(src: Path, arch: str, out: Path = DEFAULT_OUT,
          include_dirs: tuple[Path, ...] = ()) -> RefArtifacts:
    if arch in AMD_ARCHS:
        return build_amd(src, arch, out, include_dirs)
    if arch in NVIDIA_ARCHS:
        return build_nvidia(src, arch, out, include_dirs)
    raise ReferenceBuildError(missing_reason(arch) or arch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m peerdsl.reference_build",
                                description="build the HIP reference kernels")
    p.add_argument("sources", nargs="*", help="default: reference/hip/*.hip")
    p.add_argument("--arch", default="gfx1250,sm_90", help="comma-separated targets")
    p.add_argument("-o", "--out", default=str(DEFAULT_OUT))
    p.add_argument("--strict", action="store_true", help="fail when a compiler is missing")
    p.add_argument("-I", "--include", action="append", default=[], metavar="DIR",
                   help="another include directory (the package's headers are always used)")
    a = p.parse_args(argv)
    sources = [Path(s) for s in a.sources] or sorted(REF_DIR.glob("*.hip"))
    rc = 0
    for arch in [x for x in a.arch.split(",") if x]:
        why = missing_reason(arch)
        if why:
            print(f"{arch}: skipped: {why}", file=sys.stderr)
            rc = rc or (1 if a.strict else 0)
            continue
        for src in sources:
            try:
                art = build(src, arch, Path(a.out), tuple(Path(d) for d in a.include))
            except ReferenceBuildError as e:
                print(f"{arch}: {e}", file=sys.stderr)
                return 1
            print(f"{arch}: {src.name} -> {art.code_object}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
