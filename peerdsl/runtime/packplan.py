"""The trusted packing path: a kernel's argument layout compiled once into a struct format
and a generated filler, for launchers whose callers have already checked their inputs.

`kernarg.pack_args` stays the checked path and the single definition of the bytes; a
PackPlan writes the same bytes (tests/test_packplan.py compares them on random layouts)
without its per-argument checks, since it runs on every eager launch.
"""
from __future__ import annotations

import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from .kernarg import ArgSpec, KernargError, peer_tables

_CODES = {"i8": "b", "i16": "h", "i32": "i", "i64": "q", "f32": "f", "f64": "d"}


class PackPlan:
    """A kernel's argument layout compiled into one struct format and a generated filler, for
    the launch path of callers that have already checked their inputs (the communicators do,
    before any launch). Struct still range-checks every integer; dtype, device and alignment
    checks are left to `pack_args`, the checked path, whose bytes these stay equal to.

    `fill(buf, values)` writes the kernargs into any writable buffer (the loaders pass a
    preallocated one) with one `struct.pack_into`: the per-field work is a generated
    expression, not an interpreted loop, because this runs on every eager launch. Pointers
    take ints, tensors (`data_ptr()`), None (null) or driver handles (`int()`); peer-table
    entries are expected to be int addresses, and anything else takes the per-field path.
    """

    def __init__(self, args: Sequence[ArgSpec], kernarg_size: int):
        tables = peer_tables(args)
        member = {m: (base, i) for base, ms in tables.items() for i, m in enumerate(ms)}
        fmt, pos, self.fields = "<", 0, []
        for a in sorted(args, key=lambda a: a.offset):
            fmt += "x" * (a.offset - pos)
            fmt += "Q" if a.type.is_pointer else _CODES[a.type.scalar]
            pos = a.offset + a.size
            base, index = member.get(a.name, (a.name, None))
            self.fields.append((base, index, a.type.is_pointer))
        self.struct = struct.Struct(fmt + "x" * (kernarg_size - pos))
        self.size = self.struct.size
        self._tables = {b: len(ms) for b, ms in tables.items()}
        self._fast = self._compile(self._tables)

    def _compile(self, sizes: dict[str, int]) -> Any:
        """Generate `fill(buf, v)` for this layout. Names enter the source only as repr()'d
        dict keys, so a manifest cannot inject code."""
        lines, items, tvar = [], [], {}
        i = 0
        while i < len(self.fields):
            base, index, is_pointer = self.fields[i]
            if index is None:
                # inline for the common kinds (a plain tensor, an int): a call costs more
                items.append(f"(a.data_ptr() if (a := v[{base!r}]).__class__ is _T else a "
                             "if a.__class__ is int else _p(a))" if is_pointer
                             else f"v[{base!r}]")
                i += 1
                continue
            if base not in tvar:
                tvar[base] = t = f"t{len(tvar)}"
                lines.append(f"    {t} = v[{base!r}]")
            t, k = tvar[base], sizes[base]
            run = [f[:2] for f in self.fields[i:i + k]]
            if index == 0 and run == [(base, j) for j in range(k)]:
                # the whole table in order: the list itself, padded with its first entry
                items.append(f"*{t}, *({t}[:1] * ({k} - len({t})))")
                i += k
            else:
                items.append(f"({t}[{index}] if {index} < len({t}) else {t}[0])")
                i += 1
        src = ("def fill(buf, v):\n" + "".join(line + "\n" for line in lines)
               + f"    _into(buf, 0, {', '.join(items)})\n")
        torch = sys.modules.get("torch")  # never imported here; a tensor implies it is
        scope = {"_into": self.struct.pack_into, "_p": _trusted_pointer,
                 "_T": getattr(torch, "Tensor", _NoTensor)}
        # generated source: the only way to get one C-level pack call without a loop
        exec(compile(src, f"<PackPlan {len(self.fields)} fields>", "exec"), scope)  # noqa: S102
        return scope["fill"]

    def fill(self, buf: Any, values: Mapping[str, Any]) -> None:
        """Write the kernargs for `values` (name -> value, peer tables as lists) into `buf`."""
        try:
            self._fast(buf, values)
        except (struct.error, TypeError):  # a non-int table entry, or a value out of range
            self.struct.pack_into(buf, 0, *self._values(values))

    def pack(self, values: Mapping[str, Any]) -> bytes:
        buf = bytearray(self.size)
        self.fill(buf, values)
        return bytes(buf)

    def _values(self, values: Mapping[str, Any]) -> list[Any]:
        for base, k in self._tables.items():
            if not 1 <= len(values[base]) <= k:
                raise KernargError(f"peer table {base!r} takes 1..{k} entries, got "
                                   f"{len(values[base])}")
        out = []
        for base, index, is_pointer in self.fields:
            v = values[base]
            if index is not None:
                v = v[index] if index < len(v) else v[0]
            out.append(_trusted_pointer(v) if is_pointer else v)
        return out


class _NoTensor:
    """Stands for torch.Tensor in a plan compiled before torch was imported."""


def _trusted_pointer(v: Any) -> Any:
    if v.__class__ is int:
        return v
    return 0 if v is None else (v.data_ptr() if hasattr(v, "data_ptr") else int(v))
