"""`peerdsl.compile(kernel, target, **constexprs)`: one kernel, one target, in memory.

The same path as `peerdsl build` (trace, the content-addressed cache, the MLIR pipeline), so
a kernel compiled here and the same variant built into a manifest share one cache entry and
give the same bytes. Bad input raises a BuildError (a ValueError) before anything compiles:
an unknown target, a missing or unknown constexpr, a kernel that does not trace (the
message names the user's file and line).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..dsl.kernel import Kernel
from .build import (BuildError, KernelBuild, check_constexprs, compile_cached, resolve_target,
                    trace_kernel)
from .cache import jsonable


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """A compiled kernel variant.

    `args` is the manifest's argument layout ([{name, type, offset, size}], peer tables
    expanded to name_0..name_7), `resources` the counts read back from the code object:
    AMD vgpr, agpr, sgpr, lds_bytes, scratch_bytes, vgpr_spill, sgpr_spill, waves_per_simd and
    occupancy_limit (see lowering/occupancy.py); NVIDIA registers, local_bytes, shared_bytes,
    spill_stores, spill_loads, stack_bytes, barriers (from ptxas -v).
    """
    name: str                      # the instance symbol (kernel name + constexpr hash)
    target: str
    code: bytes                    # HSACO or cubin
    isa: str                       # AMDGPU assembly or PTX
    args: list[dict[str, Any]]
    kernarg_size: int
    block_size: int
    lds_bytes: int
    resources: dict[str, Any]
    entry: dict[str, Any]          # the manifest entry `peerdsl build` would write
    cached: bool                   # served from the cache (no compile ran)

    @property
    def constexprs(self) -> dict[str, Any]:
        return self.entry["constexprs"]

    def save(self, directory: str) -> tuple[str, str]:
        """Write the code object and the ISA into `directory`; returns their paths."""
        os.makedirs(directory, exist_ok=True)
        paths = (os.path.join(directory, self.entry["file"]),
                 os.path.join(directory, self.entry["isa_file"]))
        with open(paths[0], "wb") as f:
            f.write(self.code)
        with open(paths[1], "w") as f:
            f.write(self.isa)
        return paths

    def __repr__(self) -> str:
        return (f"CompiledKernel({self.name} for {self.target}, {len(self.code)} bytes, "
                f"block {self.block_size}, resources {self.resources}, "
                f"{'cached' if self.cached else 'compiled'})")


def _from_build(b: KernelBuild, target: str) -> CompiledKernel:
    e = b.entry
    return CompiledKernel(b.instance, target, b.code, b.isa, e["args"], e["kernarg_size"],
                          e["block_size"], e["lds_bytes"], e["resources"], e, b.cached)


def compile(kernel: Kernel, target: str, **constexprs: Any) -> CompiledKernel:  # noqa: A001
    """Compile one specialization of `kernel` for `target` (gfx1250, gfx950, gfx942, sm_90)
    through the build's cache. Raises BuildError on bad input, CompileError if the compiler
    fails."""
    if not isinstance(kernel, Kernel):
        raise BuildError(f"peerdsl.compile needs a @dsl.kernel function, got "
                         f"{type(kernel).__name__} {kernel!r}")
    t = resolve_target(target)
    what = f"peerdsl.compile({kernel.name}, {t.arch!r}, {jsonable(constexprs)})"
    constexprs = check_constexprs(kernel, constexprs, what)
    traced = trace_kernel(kernel, constexprs, what)
    return _from_build(compile_cached(kernel.name, kernel, constexprs, t, traced=traced), t.arch)
