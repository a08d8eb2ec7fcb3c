"""NormResult: what the norm entry points return (add_rmsnorm, fused_allreduce_rmsnorm)."""
from __future__ import annotations

from typing import Any

import torch


class NormResult(tuple):
    """What the norm entry points return: a tuple, as aiter's API returns, with named fields.

    Without FP8 it is `(out, residual_out)`; with FP8 `(q, residual_out, scale)`, plus
    `mirror` (the T output) when it was asked for. Indexing, len and unpacking all see those
    items; `.out .residual_out .q .scale .mirror` name them (None where absent) and `_fields`
    lists the names of the items in order, like a NamedTuple's.
    """
    out: torch.Tensor | None          # T output (None with FP8 and no mirror)
    residual_out: torch.Tensor | None
    q: torch.Tensor | None            # FP8 output
    scale: torch.Tensor | None
    mirror: torch.Tensor | None

    def __new__(cls, out: torch.Tensor | None, residual_out: torch.Tensor | None,
                q: torch.Tensor | None = None, scale: torch.Tensor | None = None,
                mirror: torch.Tensor | None = None) -> "NormResult":
        if q is None:
            fields = ("out", "residual_out")
        else:
            fields = ("q", "residual_out", "scale") + (("mirror",) if mirror is not None else ())
        named = {"out": out, "residual_out": residual_out, "q": q, "scale": scale,
                 "mirror": mirror}
        self = super().__new__(cls, tuple(named[f] for f in fields))
        self.__dict__.update(named, _fields=fields)
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"NormResult is immutable (a tuple); cannot set {name!r}")

    def __getnewargs__(self) -> tuple:  # pickling/copy rebuild from the named fields
        return (self.out, self.residual_out, self.q, self.scale, self.mirror)

    def _asdict(self) -> dict[str, torch.Tensor | None]:
        return dict(zip(self._fields, self))

    def __repr__(self) -> str:
        items = ", ".join(f"{f}={_short(v)}" for f, v in zip(self._fields, self))
        return f"NormResult({items})"


def _short(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"tensor(shape={tuple(t.shape)}, dtype={t.dtype})"
    return repr(t)
