"""Where the external tools are, and their versions (no MLIR import: the cache key needs
the versions on a warm path that must not start the MLIR worker).
"""
from __future__ import annotations

import functools
import glob
import importlib.metadata
import os
import stat
import sys
import threading

import peerdsl


def cache_dir() -> str:
    """PEERDSL_CACHE_DIR, else ~/.cache/peerdsl (XDG_CACHE_HOME honoured)."""
    d = os.environ.get("PEERDSL_CACHE_DIR")
    if not d:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        d = os.path.join(base, "peerdsl")
    return d


def _pkg_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def cuda_nvcc_dir() -> str:
    try:
        import nvidia.cuda_nvcc as m  # the pip package laid out as a CUDA toolkit dir
    except ImportError as e:
        raise RuntimeError("sm_90 builds need `pip install nvidia-cuda-nvcc-cu12` (ptxas)") from e
    return list(m.__path__)[0]


def ptxas_path() -> str:
    return os.path.join(cuda_nvcc_dir(), "bin", "ptxas")


def _zig() -> str:
    """The zig executable of the `ziglang` package (what `python -m ziglang` execs); calling
    it directly saves a Python start-up per link."""
    import importlib.util
    spec = importlib.util.find_spec("ziglang")
    if spec is None or not spec.origin:
        raise RuntimeError("AMD builds need `pip install ziglang` (it provides ld.lld)")
    zig = os.path.join(os.path.dirname(spec.origin), "zig")
    return zig if os.access(zig, os.X_OK) else f"{sys.executable}\" -m \"ziglang"


def amd_toolkit() -> str:
    """A toolkit dir whose llvm/bin/ld.lld runs ziglang's LLD (what gpu-module-to-binary
    looks for; it never searches PATH). Created once under the cache dir."""
    tk = os.path.join(cache_dir(), "toolkit")
    lld = os.path.join(tk, "llvm", "bin", "ld.lld")
    script = f'#!/bin/sh\nexec "{_zig()}" ld.lld "$@"\n'
    try:
        with open(lld) as f:
            if f.read() == script:
                return tk
    except OSError:
        pass
    os.makedirs(os.path.dirname(lld), exist_ok=True)
    tmp = f"{lld}.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w") as f:
        f.write(script)
    os.chmod(tmp, os.stat(tmp).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.replace(tmp, lld)  # atomic: concurrent builds never see a half-written script
    return tk


@functools.lru_cache(maxsize=None)
def llvm_version() -> str:
    try:
        import importlib.util
        spec = importlib.util.find_spec("flydsl")
        libs = os.path.join(os.path.dirname(spec.origin), "_mlir", "_mlir_libs")  # type: ignore
        for path in sorted(glob.glob(os.path.join(libs, "*.so.*"))):
            return path.split(".so.", 1)[1]
    except Exception:
        pass
    return "unknown"


@functools.lru_cache(maxsize=None)
def compiler_versions() -> dict[str, str]:
    return {"peerdsl": peerdsl.__version__, "flydsl": _pkg_version("flydsl"),
            "llvm": llvm_version(), "ptxas": _pkg_version("nvidia-cuda-nvcc-cu12"),
            "lld": "ziglang " + _pkg_version("ziglang")}
