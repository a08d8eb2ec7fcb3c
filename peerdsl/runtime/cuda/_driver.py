"""The one place that imports cuda-bindings, lazily, and turns CUresults into exceptions.

Importing peerdsl.runtime.cuda must work where cuda-bindings is absent (CI, AMD boxes);
only the first driver call needs it. Tests swap in a fake with `use_driver(fake)`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

_driver: Any = None


def driver() -> Any:
    """`cuda.bindings.driver` (cuda-bindings >= 12.6), or the older `cuda.cuda` alias."""
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as d
        except ImportError as e1:
            try:
                from cuda import cuda as d  # cuda-python 11.x / 12.x < 12.6 layout
            except ImportError:
                raise ImportError(
                    "peerdsl.runtime.cuda needs NVIDIA's cuda-bindings to talk to the GPU "
                    "(`pip install cuda-bindings`, then `from cuda.bindings import driver` "
                    f"must work): {e1}") from e1
        _driver = d
    return _driver


@contextlib.contextmanager
def use_driver(fake: Any) -> Iterator[Any]:
    """Run with `fake` as the driver module (tests); restores the previous one after."""
    global _driver
    old, _driver = _driver, fake
    try:
        yield fake
    finally:
        _driver = old


def error_text(err: Any) -> str:
    """'CUDA_ERROR_X (code): description' without raising, even if the driver is broken."""
    name = getattr(err, "name", None) or str(err)
    try:
        code = int(err)
    except Exception:
        code = getattr(err, "value", "?")
    desc = ""
    try:
        res = driver().cuGetErrorString(err)
        s = res[1] if isinstance(res, tuple) and len(res) > 1 else res
        desc = s.decode() if isinstance(s, bytes) else str(s or "")
    except Exception:
        pass
    return f"{name} ({code})" + (f": {desc}" if desc else "")


def check(result: Any, call: str) -> Any:
    """Unwrap a cuda-bindings return tuple (err, *values); raise RuntimeError on error.

    Returns None, the single value, or a tuple of values.
    """
    if isinstance(result, tuple):
        err, vals = result[0], result[1:]
    else:
        err, vals = result, ()
    if int(err) != 0:
        raise RuntimeError(f"{call} failed: {error_text(err)}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals
