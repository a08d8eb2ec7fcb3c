"""Kernel-argument packing, the one implementation: a layout compiled once into a struct
format and a generated filler.

A `PackPlan` is built from a manifest's layout (`PackPlan(entry.args, entry.kernarg_size)`)
or from any other one, e.g. the (name, offset, size, kind) fields of a reference cubin
(`PackPlan.from_layout`). Both ways of packing end in the same `struct.pack_into`, so they
write the same bytes:

    plan.fill(buf, values) / plan.pack(values)   trusted: callers that checked their inputs
                                                 (the communicators, on every eager launch)
    plan.pack_checked(values, device=None)       every argument checked first: missing and
                                                 unknown names, scalar types and ranges,
                                                 pointers' dtype, device and alignment

Values: name -> value; a peer table NAME_0..NAME_{k-1} takes `NAME=[addr, ...]` (1..k
entries, padded with the first) or, on the checked path, its members one by one. Pointers
take ints, tensors (`data_ptr()`), None (null) or driver handles (`int()`).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .kernarg import (_SCALARS, ArgSpec, ArgType, KernargError, TORCH_DTYPES,
                      arg_specs_from_json, parse_type, peer_tables)

__all__ = ["PackPlan", "pack_args", "pack_kernargs", "unpack_args", "expand_peer_tables"]

_CODES = {"i8": "b", "i16": "h", "i32": "i", "i64": "q", "f32": "f", "f64": "d"}
_F32_MAX = 3.4028234663852886e38


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str               # the argument (a peer-table member: NAME_i)
    offset: int
    size: int
    kind: str               # "ptr", "scalar" or "bytes"
    type: ArgType | None    # None for "bytes"
    base: str               # the value's key: the table's name for members
    index: int | None       # position in the table, None outside one


class PackPlan:
    """One kernel's argument layout, compiled for packing (see the module docstring)."""

    def __init__(self, args: Sequence[ArgSpec], kernarg_size: int, kernel: str = "kernel"):
        tables = peer_tables(args)
        member = {m: (base, i) for base, ms in tables.items() for i, m in enumerate(ms)}
        fields = []
        for a in args:
            base, index = member.get(a.name, (a.name, None))
            fields.append(_Field(a.name, a.offset, a.size,
                                 "ptr" if a.type.is_pointer else "scalar", a.type, base, index))
        self._setup(fields, kernarg_size, kernel)

    @classmethod
    def from_layout(cls, fields: Iterable[tuple[str, int, int, str]], size: int | None = None,
                    kernel: str = "kernel") -> "PackPlan":
        """A plan for a layout that is not a manifest's, e.g. a HIP/CUDA reference kernel's
        parameters read from its code object. Each field is (name, offset, size, kind):

            kind "i8" "i16" "i32" "i64" "f32" "f64"   a scalar of that type
                 "ptr" or "ptr<ELEM>"                  one pointer (8 bytes)
                 "ptrs"                                size/8 pointers by value (a struct of
                                                       peer pointers): pass a list of 1..k
                                                       addresses, padded with the first
                 "bytes"                               `size` raw bytes, passed as bytes

        `size`: the whole buffer (default: the end of the last field)."""
        out = []
        for name, offset, nbytes, kind in fields:
            name, offset, nbytes, kind = str(name), int(offset), int(nbytes), str(kind).strip()
            if kind == "bytes":
                out.append(_Field(name, offset, nbytes, "bytes", None, name, None))
            elif kind == "ptrs":
                if nbytes < 8 or nbytes % 8:
                    raise KernargError(f"{kernel}: argument {name!r} of kind ptrs is {nbytes} "
                                       "bytes, not a multiple of 8")
                t = parse_type("ptr")
                out.extend(_Field(f"{name}_{i}", offset + 8 * i, 8, "ptr", t, name, i)
                           for i in range(nbytes // 8))
            else:
                t = parse_type(kind)
                if t.size != nbytes:
                    raise KernargError(f"{kernel}: argument {name!r} is {nbytes} bytes but a "
                                       f"{kind} takes {t.size}")
                out.append(_Field(name, offset, nbytes, "ptr" if t.is_pointer else "scalar",
                                  t, name, None))
        end = max((f.offset + f.size for f in out), default=0)
        plan = cls.__new__(cls)
        plan._setup(out, end if size is None else int(size), kernel)
        return plan

    def _setup(self, fields: list[_Field], kernarg_size: int, kernel: str) -> None:
        self.kernel = kernel
        self.fields = sorted(fields, key=lambda f: f.offset)
        fmt, pos, prev = "<", 0, None
        for f in self.fields:
            if f.offset < pos:
                raise KernargError(f"{kernel}: arguments {prev!r} and {f.name!r} overlap")
            fmt += "x" * (f.offset - pos)
            fmt += ("Q" if f.kind == "ptr" else f"{f.size}s" if f.kind == "bytes"
                    else _CODES[f.type.scalar])
            pos, prev = f.offset + f.size, f.name
        if pos > kernarg_size:
            raise KernargError(f"{kernel}: argument {prev!r} ends at {pos}, past the "
                               f"{kernarg_size}-byte buffer")
        self.struct = struct.Struct(fmt + "x" * (kernarg_size - pos))
        self.size = self.struct.size
        self.tables: dict[str, int] = {}
        for f in self.fields:
            if f.index is not None:
                self.tables[f.base] = max(self.tables.get(f.base, 0), f.index + 1)
        self._by_name = {f.name: f for f in self.fields}
        self._fast = self._compile()

    @property
    def names(self) -> list[str]:
        """The keys `pack` expects: tables by their base name, in layout order."""
        return list(dict.fromkeys(f.base for f in self.fields))

    # ------------------------------------------------------------------ trusted
    def _compile(self) -> Any:
        """Generate `fill(buf, v)` for this layout: one C-level `pack_into` call, no loop over
        fields (this runs on every eager launch). Names enter the source only as repr()'d
        dict keys, so a manifest cannot inject code."""
        lines, items, tvar = [], [], {}
        i = 0
        while i < len(self.fields):
            f = self.fields[i]
            if f.index is None:
                # inline for the common kinds (a plain tensor, an int): a call costs more
                items.append(f"(a.data_ptr() if (a := v[{f.base!r}]).__class__ is _T else a "
                             "if a.__class__ is int else _p(a))" if f.kind == "ptr"
                             else f"v[{f.base!r}]")
                i += 1
                continue
            if f.base not in tvar:
                tvar[f.base] = t = f"t{len(tvar)}"
                lines.append(f"    {t} = v[{f.base!r}]")
            t, k = tvar[f.base], self.tables[f.base]
            run = [(g.base, g.index) for g in self.fields[i:i + k]]
            if f.index == 0 and run == [(f.base, j) for j in range(k)]:
                # the whole table in order: the list itself, padded with its first entry
                items.append(f"*{t}, *({t}[:1] * ({k} - len({t})))")
                i += k
            else:
                items.append(f"({t}[{f.index}] if {f.index} < len({t}) else {t}[0])")
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
        """Write the kernargs for `values` (name -> value, peer tables as lists) into `buf`,
        any writable buffer (the loaders pass a preallocated one)."""
        try:
            self._fast(buf, values)
        except (struct.error, TypeError):  # a non-int table entry, or a value out of range
            self.struct.pack_into(buf, 0, *self._trusted_values(values))

    def pack(self, values: Mapping[str, Any]) -> bytes:
        buf = bytearray(self.size)
        self.fill(buf, values)
        return bytes(buf)

    def _trusted_values(self, values: Mapping[str, Any]) -> list[Any]:
        for base, k in self.tables.items():
            if not 1 <= len(values[base]) <= k:
                raise KernargError(f"peer table {base!r} takes 1..{k} entries, got "
                                   f"{len(values[base])}")
        out = []
        for f in self.fields:
            v = values[f.base]
            if f.index is not None:
                v = v[f.index] if f.index < len(v) else v[0]
            out.append(_trusted_pointer(v) if f.kind == "ptr" else v)
        return out

    # ------------------------------------------------------------------ checked
    def pack_checked(self, values: Mapping[str, Any], *, device: int | None = None) -> bytes:
        """Check every argument, then pack. `device`: the GPU ordinal tensors must be on."""
        vals = self._expand(values)
        missing = [f.name for f in self.fields if f.name not in vals]
        unknown = sorted(set(vals) - set(self._by_name))
        if unknown or missing:
            hint = f"; peer tables: {sorted(self.tables)}" if self.tables else ""
            raise KernargError(f"{self.kernel}: missing arguments {missing}, unknown arguments "
                               f"{unknown} (expects {[f.name for f in self.fields]}{hint})")
        out = []
        for f in self.fields:
            v = vals[f.name]
            if f.kind == "ptr":
                if not (type(v) is int and 0 <= v < (1 << 64)
                        and not v % min(f.type.pointee_bytes, 16)):  # the common case inline
                    v = _pointer_value(f.name, f.type, v, device)
            elif f.kind == "scalar":
                v = _scalar_value(f.name, f.type, v)
            elif not isinstance(v, (bytes, bytearray, memoryview)) or len(v) != f.size:
                raise KernargError(f"argument {f.name!r} takes {f.size} raw bytes, got "
                                   f"{type(v).__name__} of {len(v) if hasattr(v, '__len__') else '?'}")
            out.append(v)
        buf = bytearray(self.size)
        self.struct.pack_into(buf, 0, *out)
        return bytes(buf)

    def _expand(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Replace `NAME=[a0, a1, ...]` by NAME_0..NAME_{k-1}, padding with a0."""
        out = dict(values)
        for base, k in self.tables.items():
            if base not in out:
                continue
            members = [f.name for f in self.fields if f.base == base]
            members.sort(key=lambda m: self._by_name[m].index)
            lst = out.pop(base)
            if not isinstance(lst, (list, tuple)):
                raise KernargError(f"argument {base!r} is the peer table {members[0]}.."
                                   f"{members[-1]}: pass a list of up to {k} addresses")
            if not 1 <= len(lst) <= k:
                raise KernargError(f"peer table {base!r} takes 1..{k} entries, got {len(lst)}")
            clash = [m for m in members if m in out]
            if clash:
                raise KernargError(f"peer table {base!r} given both as a list and as {clash}")
            for i, m in enumerate(members):
                out[m] = lst[i] if i < len(lst) else lst[0]
        return out

    def unpack(self, data: bytes) -> dict[str, Any]:
        """The inverse, for tests and logs: name -> int address / int / float / bytes."""
        return dict(zip((f.name for f in self.fields), self.struct.unpack_from(data)))


class _NoTensor:
    """Stands for torch.Tensor in a plan compiled before torch was imported."""


def _trusted_pointer(v: Any) -> Any:
    if v.__class__ is int:
        return v
    return 0 if v is None else (v.data_ptr() if hasattr(v, "data_ptr") else int(v))


def _is_tensor(v: Any) -> bool:
    return type(v).__module__.split(".")[0] == "torch" and hasattr(v, "data_ptr")


def _pointer_value(name: str, t: ArgType, v: Any, device: int | None) -> int:
    if v is None:
        return 0  # an explicit null (optional buffers); a *missing* arg still raises
    if _is_tensor(v):
        dev = v.device
        if dev.type != "cuda":  # ROCm torch names its GPUs "cuda" too
            raise KernargError(f"argument {name!r}: tensor is on {dev}, expected a GPU tensor")
        if device is not None and dev.index is not None and dev.index != device:
            raise KernargError(f"argument {name!r}: tensor is on {dev}, kernel launches on "
                               f"device {device}")
        dname = str(v.dtype).replace("torch.", "")
        if t.scalar is not None and dname not in TORCH_DTYPES.get(t.scalar, set()):
            raise KernargError(f"argument {name!r}: tensor dtype {dname} does not match "
                               f"{t.text} (accepts {sorted(TORCH_DTYPES[t.scalar])}; pass "
                               "t.data_ptr() to override)")
        addr = int(v.data_ptr())
    elif isinstance(v, (bool, float)):
        raise KernargError(f"argument {name!r}: {type(v).__name__} is not a pointer")
    else:
        try:
            addr = operator.index(v)
        except TypeError:
            try:  # driver handle objects (CUdeviceptr, hip Pointer) convert with int()
                addr = int(v)
            except (TypeError, ValueError):
                raise KernargError(f"argument {name!r}: expected a device address (int) or a "
                                   f"tensor, got {type(v).__name__}") from None
    if not 0 <= addr < (1 << 64):
        raise KernargError(f"argument {name!r}: address {addr:#x} is not a 64-bit address")
    align = min(t.pointee_bytes, 16)
    if addr % align:
        raise KernargError(f"argument {name!r}: address {addr:#x} is not {align}-byte aligned "
                           f"as {t.text} requires")
    return addr


def _scalar_value(name: str, t: ArgType, v: Any) -> int | float:
    _fmt, _size, lo, hi = _SCALARS[t.scalar]
    if _is_tensor(v):
        raise KernargError(f"argument {name!r} is a {t.text} scalar, got a tensor")
    if lo is not None:
        if isinstance(v, (float, bool)):
            raise KernargError(f"argument {name!r}: {t.text} needs an int, got "
                               f"{type(v).__name__} {v!r}")
        try:
            iv = operator.index(v)
        except TypeError:
            raise KernargError(f"argument {name!r}: {t.text} needs an int, got "
                               f"{type(v).__name__}") from None
        if not lo <= iv <= hi:
            raise KernargError(f"argument {name!r}: {iv} is out of range for {t.text} "
                               f"[{lo}, {hi}]")
        return iv
    try:
        fv = float(v)
    except (TypeError, ValueError):
        raise KernargError(f"argument {name!r}: {t.text} needs a number, got "
                           f"{type(v).__name__}") from None
    if t.scalar == "f32" and math.isfinite(fv) and abs(fv) > _F32_MAX:
        raise KernargError(f"argument {name!r}: {fv!r} overflows f32")
    return fv


# ---- the module-level forms (layouts given as ArgSpecs or a manifest entry) -----------------

@functools.lru_cache(maxsize=256)
def _plan(args: tuple[ArgSpec, ...], kernarg_size: int, kernel: str) -> PackPlan:
    return PackPlan(args, kernarg_size, kernel)


def pack_args(args: Sequence[ArgSpec], kernarg_size: int, values: Mapping[str, Any], *,
              device: int | None = None, kernel: str = "kernel") -> bytes:
    """The checked packing of `values` into a layout (PackPlan.pack_checked)."""
    return _plan(tuple(args), int(kernarg_size), kernel).pack_checked(values, device=device)


def expand_peer_tables(args: Sequence[ArgSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """`NAME=[a0, ...]` replaced by the table's members NAME_0..NAME_{k-1} (padded with a0)."""
    end = max((a.offset + a.size for a in args), default=0)
    return _plan(tuple(args), end, "kernel")._expand(values)


def pack_kernargs(entry: Any, args: Mapping[str, Any], *, device: int | None = None) -> bytes:
    """Pack `args` (name -> value) for a manifest kernel entry (a KernelEntry or its JSON dict).

    Pointers: int device address, torch tensor (device and dtype checked), None (null), or
    for a peer table NAME_0..NAME_7 a list under NAME. Scalars are range-checked.
    """
    if isinstance(entry, Mapping):
        return pack_args(arg_specs_from_json(entry["args"]), int(entry["kernarg_size"]), args,
                         device=device, kernel=str(entry.get("symbol", "kernel")))
    return entry.pack(args, device=device)


def unpack_args(args: Sequence[ArgSpec], data: bytes) -> dict[str, int | float]:
    """The inverse, for tests and logs: name -> int address / int / float."""
    end = max((a.offset + a.size for a in args), default=0)
    return _plan(tuple(args), end, "kernel").unpack(data[:end])
