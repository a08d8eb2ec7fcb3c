"""Compile one traced kernel for one target: a short list of stages per vendor.

  ROCDL: generate MLIR -> convert (scf, gpu -> rocdl) -> gpu-module-to-binary twice
         (format=bin: HSACO linked by our ld.lld wrapper; format=isa: assembly text)
         -> read resources from the code object's metadata note
  NVVM:  generate MLIR -> convert (scf, gpu -> nvvm) -> gpu-module-to-binary format=isa (PTX)
         -> our own `ptxas -v --fmad=false` -> cubin + resources from ptxas' report

MLIR runs in a persistent worker process (`worker.py`); if it dies (an LLVM assert), the
call raises CompileError with its stderr tail and the next call starts a fresh worker.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import tempfile
import threading
from typing import Any, Callable

from ..dsl import ir
from . import codeobject, mlir_gen
from .errors import CompileError
from .targets import Target, get_target
from .toolchain import amd_toolkit, ptxas_path
from .worker import read_frame, write_frame


@dataclasses.dataclass
class Compiled:
    """What the stages produce for one kernel on one target."""
    target: Target
    symbol: str
    kernel: ir.Kernel
    mlir: str = ""
    line_locs: dict[int, str] = dataclasses.field(default_factory=dict)
    binary: bytes = b""          # HSACO or cubin
    isa: str = ""                # AMDGPU assembly or PTX
    resources: dict[str, int] = dataclasses.field(default_factory=dict)
    args: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    kernarg_size: int = 0
    lds_bytes: int = 0
    log: str = ""


# ----------------------------------------------------------------------------- worker

def _timeout() -> float:
    return float(os.environ.get("PEERDSL_COMPILE_TIMEOUT", "600"))


class WorkerClient:
    """One persistent MLIR worker process. Not thread-safe: the pool hands it to one caller."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.stderr_path = ""

    def _start(self) -> None:
        fd, self.stderr_path = tempfile.mkstemp(prefix="peerdsl-worker-", suffix=".log")
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, "-m", "peerdsl.lowering.worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=fd, env=env)
        os.close(fd)

    def _stderr_tail(self, n: int = 4000) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin and self.proc.stdout
        # a hung compile (an LLVM infinite loop) must not hang the build: kill the worker
        watchdog = threading.Timer(_timeout(), self.proc.kill)
        watchdog.start()
        try:
            write_frame(self.proc.stdin, req)
            resp = read_frame(self.proc.stdout)
        except (BrokenPipeError, OSError):
            resp = None
        finally:
            watchdog.cancel()
        if resp is None:  # the worker died mid-request: report it and start afresh next time
            code = self.proc.wait()
            tail = self._stderr_tail()
            self.close()
            why = (f"was killed after {_timeout():.0f} s (PEERDSL_COMPILE_TIMEOUT)"
                   if code == -9 else f"died (exit status {code})")
            raise CompileError(f"the MLIR worker {why} compiling this kernel; LLVM said:\n"
                               f"{tail.strip() or '(nothing)'}")
        return resp

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.stdin.close()  # type: ignore[union-attr]
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            self.proc = None
        if self.stderr_path:
            try:
                os.unlink(self.stderr_path)
            except OSError:
                pass
            self.stderr_path = ""


class WorkerPool:
    """Workers shared by threads; each call borrows one for the duration of a request."""

    def __init__(self) -> None:
        self._free: list[WorkerClient] = []
        self._lock = threading.Lock()

    def request(self, req: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            w = self._free.pop() if self._free else WorkerClient()
        try:
            return w.request(req)
        finally:
            with self._lock:
                self._free.append(w)

    def close(self) -> None:
        with self._lock:
            for w in self._free:
                w.close()
            self._free.clear()


POOL = WorkerPool()


# ----------------------------------------------------------------------------- stages

def _source_error(text: str, c: Compiled) -> str:
    """Append the DSL source line of any MLIR text position the error mentions."""
    lines = sorted({int(m.group(1)) for m in re.finditer(r'"-":(\d+):\d+', text)})
    where = [c.line_locs[n] for n in lines if n in c.line_locs]
    # our locs print as "file":line:0; show them as the usual file:line
    text = re.sub(r'"([^"\n]+)":(\d+):0\b', r"\1:\2", text)
    return text + ("\nat kernel source " + ", ".join(dict.fromkeys(where)) if where else "")


def stage_generate(c: Compiled) -> None:
    c.mlir, c.line_locs = mlir_gen.generate(c.kernel, c.target, c.symbol)
    c.lds_bytes = c.kernel.shared_bytes()


def _convert(t: Target) -> str:
    conv = (f"convert-gpu-to-rocdl{{chipset={t.arch}}}" if t.is_amd else "convert-gpu-to-nvvm")
    return f"builtin.module(gpu.module(convert-scf-to-cf,{conv},reconcile-unrealized-casts))"


def _run_mlir(c: Compiled, binaries: dict[str, str]) -> dict[str, bytes]:
    try:
        resp = POOL.request({"mlir": c.mlir, "convert": _convert(c.target),
                             "binaries": binaries})
    except CompileError as e:  # the worker crashed: say which kernel did it
        raise CompileError(f"compiling {c.kernel.name} ({c.symbol}) for {c.target.arch}: "
                           f"{e}") from None
    if not resp.get("ok"):
        raise CompileError(f"compiling {c.kernel.name} ({c.symbol}) for {c.target.arch} "
                           f"failed:\n{_source_error(resp.get('error', ''), c)}")
    return resp["objects"]


def stage_rocdl(c: Compiled) -> None:
    tk = amd_toolkit()
    objs = _run_mlir(c, {
        "bin": f"builtin.module(gpu-module-to-binary{{format=bin toolkit={tk}}})",
        "isa": "builtin.module(gpu-module-to-binary{format=isa})"})
    c.binary, c.isa = objs["bin"], objs["isa"].decode(errors="replace")


def stage_amd_metadata(c: Compiled) -> None:
    info = codeobject.read_amd(c.binary, c.symbol)
    if info.mach != c.target.elf_mach:
        raise CompileError(f"{c.symbol}: code object is for mach {info.mach:#x}, "
                           f"expected {c.target.elf_mach:#x} ({c.target.arch})")
    c.resources, c.kernarg_size = info.resources, info.kernarg_size
    c.lds_bytes = info.lds_bytes
    c.args = codeobject.name_args(c.kernel, info.args)


def stage_nvvm_ptx(c: Compiled) -> None:
    objs = _run_mlir(c, {"isa": "builtin.module(gpu-module-to-binary{format=isa})"})
    c.isa = objs["isa"].decode(errors="replace").rstrip("\x00")


def stage_ptxas(c: Compiled) -> None:
    # --fmad=false: ptxas must not contract mul+add into fma (results must match the sim);
    # NVPTX already emits mul.rn/add.rn, which ptxas never contracts, this is belt and braces.
    with tempfile.TemporaryDirectory(prefix="peerdsl-ptxas-") as d:
        src, dst = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(c.isa)
        p = subprocess.run([ptxas_path(), f"-arch={c.target.arch}", "-v", "--fmad=false", "-O3",
                            src, "-o", dst], capture_output=True, text=True)
        c.log = p.stdout + p.stderr
        if p.returncode != 0:
            raise CompileError(f"ptxas failed for {c.symbol} ({c.kernel.name}):\n{c.log}")
        with open(dst, "rb") as f:
            c.binary = f.read()
    c.resources = codeobject.parse_ptxas_log(c.log, c.symbol)
    c.args, c.kernarg_size = codeobject.nvidia_params(c.kernel)
    codeobject.check_cubin_params(c.binary, c.symbol, c.args, c.kernarg_size)
    c.lds_bytes = c.resources.get("smem_bytes", c.lds_bytes)  # what ptxas allocated


STAGES: dict[str, list[Callable[[Compiled], None]]] = {
    "amd": [stage_generate, stage_rocdl, stage_amd_metadata],
    "nvidia": [stage_generate, stage_nvvm_ptx, stage_ptxas],
}


def compile_kernel(kernel: ir.Kernel, target: "str | Target", symbol: str | None = None
                   ) -> Compiled:
    """Run the target's stages on a traced kernel. Raises CompileError, never aborts."""
    t = get_target(target)
    c = Compiled(t, symbol or kernel.name, kernel)
    for stage in STAGES[t.vendor]:
        stage(c)
    return c


def compile_mlir(text: str, target: "str | Target") -> dict[str, bytes]:
    """Compile hand-written MLIR text (tests, probes) through the target's MLIR passes."""
    t = get_target(target)
    c = Compiled(t, "mlir", ir.Kernel("mlir", [], ir.Block(), 32, {}, []), mlir=text)
    return _run_mlir(c, {"isa": "builtin.module(gpu-module-to-binary{format=isa})"})


def abort_worker_for_test(hang: bool = False) -> None:
    """Make a worker die as an LLVM assert would, or hang (tests of the recovery paths)."""
    POOL.request({"op": "hang" if hang else "abort"})


def worker_versions() -> dict[str, str]:
    resp = POOL.request({"op": "versions"})
    return resp["versions"]
