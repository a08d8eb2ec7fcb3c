"""The one place that imports hip-python (`from hip import hip`), lazily; error checking.

Importing peerdsl.runtime.hip must work without hip-python or ROCm. Tests swap in a fake
module with `use_hip(fake)` that records the calls.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

_hip: Any = None


def hip() -> Any:
    global _hip
    if _hip is None:
        try:
            from hip import hip as h
        except ImportError as e:
            raise ImportError("peerdsl.runtime.hip needs AMD's hip-python (`pip install "
                              "hip-python` matching the ROCm release; `from hip import hip` "
                              f"must work): {e}") from e
        _hip = h
    return _hip


@contextlib.contextmanager
def use_hip(fake: Any) -> Iterator[Any]:
    global _hip
    old, _hip = _hip, fake
    try:
        yield fake
    finally:
        _hip = old


def _code(err: Any) -> int:
    return int(getattr(err, "value", err))


def error_text(err: Any) -> str:
    name = getattr(err, "name", None) or str(err)
    desc = ""
    try:
        res = hip().hipGetErrorString(err)
        s = res[1] if isinstance(res, tuple) and len(res) > 1 else res
        desc = s.decode() if isinstance(s, bytes) else str(s or "")
    except Exception:
        pass
    return f"{name} ({_code(err)})" + (f": {desc}" if desc else "")


def check(result: Any, call: str) -> Any:
    """Unwrap hip-python's (hipError_t, *values); raise RuntimeError naming the call."""
    if isinstance(result, tuple):
        err, vals = result[0], result[1:]
    else:
        err, vals = result, ()
    if _code(err) != 0:
        raise RuntimeError(f"{call} failed: {error_text(err)}")
    if not vals:
        return None
    return vals[0] if len(vals) == 1 else vals


def as_int(p: Any) -> int:
    """hip-python returns pointers as Pointer objects; get the address."""
    if p is None:
        return 0
    if isinstance(p, int):
        return p
    try:
        return int(p)
    except TypeError:
        return int(p.as_c_void_p().value or 0)
