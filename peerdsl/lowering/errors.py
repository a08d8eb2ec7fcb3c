"""Exceptions of the lowering. Every failure surfaces as one of these, never a crash."""
from __future__ import annotations


class CompileError(Exception):
    """Compiling a kernel failed (bad IR, an MLIR/LLVM error, ptxas, or a crashed worker)."""


class LoweringError(CompileError):
    """The kernel IR cannot be lowered; the message names the DSL source line."""
