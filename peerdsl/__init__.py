"""peerdsl: fused multi-GPU collectives written in a Python kernel DSL."""
__version__ = "0.1.0"

from .dsl import kernel  # noqa: E402,F401
