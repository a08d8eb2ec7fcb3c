"""Kernel-argument packing: the exact bytes a kernel reads, built from the manifest's layout.

Pure Python + struct (torch only when a tensor is passed). One packed buffer is the single
source of truth for every backend: HIP passes it whole (HIP_LAUNCH_PARAM_BUFFER_POINTER),
CUDA passes it whole or as per-argument pointers into it, and the tests read it back.

Argument types (as the lowering writes them): scalars `i32`, `i64`, `f32`; pointers
`ptr<ELEM,SPACE>` with ELEM a scalar (`bf16`) or a vector (`bf16x8`). A peer-pointer table
is a run of pointer args `NAME_0 .. NAME_{k-1}`; the caller may pass `NAME=[addr, ...]`
(up to k entries, padded with the first so unused slots still point at valid memory).
"""
from __future__ import annotations

import ctypes
import dataclasses
import math
import operator
import re
import struct
from typing import Any, Iterable, Mapping, Sequence


class KernargError(ValueError):
    """A kernel argument is missing, unknown, of the wrong type, or out of range."""


# name -> (struct format, size, min, max); floats have no integer range.
_SCALARS: dict[str, tuple[str, int, int | None, int | None]] = {
    "i8": ("<b", 1, -(1 << 7), (1 << 7) - 1),
    "i16": ("<h", 2, -(1 << 15), (1 << 15) - 1),
    "i32": ("<i", 4, -(1 << 31), (1 << 31) - 1),
    "i64": ("<q", 8, -(1 << 63), (1 << 63) - 1),
    "f32": ("<f", 4, None, None),
    "f64": ("<d", 8, None, None),
}
_ELEM_BYTES = {"i1": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "f16": 2, "bf16": 2, "f32": 4,
               "f64": 8}
# Torch dtypes (by their short name) a typed pointer accepts. float8 rides on i8 pointers.
_TORCH_DTYPES = {
    "bf16": {"bfloat16"},
    "f16": {"float16"},
    "f32": {"float32"},
    "f64": {"float64"},
    "i32": {"int32", "uint32"},
    "i64": {"int64", "uint64"},
    "i16": {"int16", "uint16"},
    "i8": {"int8", "uint8", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
           "float8_e8m0fnu"},
    "i1": {"bool"},
}
_PTR_RE = re.compile(r"^ptr(?:<\s*([a-z][a-z0-9]*?)(?:x(\d+))?\s*(?:,\s*([a-z_]+)\s*)?>)?$")
_TABLE_RE = re.compile(r"^(.+)_(\d+)$")
POINTER_BYTES = 8


@dataclasses.dataclass(frozen=True)
class ArgType:
    text: str            # as written in the manifest
    is_pointer: bool
    scalar: str | None   # scalar name (i32 ...) for scalars, element scalar for pointers
    vector: int = 1      # lanes of the pointee (bf16x8 -> 8)
    space: str | None = None

    @property
    def size(self) -> int:
        return POINTER_BYTES if self.is_pointer else _SCALARS[self.scalar][1]

    @property
    def pointee_bytes(self) -> int:
        """Bytes of one pointee, i.e. the address alignment the kernel may rely on (<= 16)."""
        if self.scalar is None:
            return 1
        return _ELEM_BYTES[self.scalar] * self.vector


def parse_type(text: str) -> ArgType:
    t = text.strip()
    if t in _SCALARS:
        return ArgType(t, False, t)
    m = _PTR_RE.match(t)
    if m is None:
        raise KernargError(f"unknown argument type {text!r} (scalars: {sorted(_SCALARS)}, "
                           "pointers: ptr<ELEM,SPACE>)")
    elem, lanes, space = m.group(1), m.group(2), m.group(3)
    if elem is not None and elem not in _ELEM_BYTES:
        # `ptr<global>`: an untyped pointer with only a space
        if elem in ("global", "shared", "generic") and lanes is None and space is None:
            return ArgType(t, True, None, 1, elem)
        raise KernargError(f"unknown pointer element {elem!r} in {text!r}")
    return ArgType(t, True, elem, int(lanes) if lanes else 1, space or "global")


@dataclasses.dataclass(frozen=True)
class ArgSpec:
    name: str
    type: ArgType
    offset: int
    size: int


def arg_specs_from_json(args: Sequence[Mapping[str, Any]]) -> tuple[ArgSpec, ...]:
    out = []
    for i, a in enumerate(args):
        missing = [k for k in ("name", "type", "offset", "size") if k not in a]
        if missing:
            raise KernargError(f"argument #{i} ({a.get('name', '?')}) lacks {missing}")
        out.append(ArgSpec(str(a["name"]), parse_type(str(a["type"])), int(a["offset"]),
                           int(a["size"])))
    return tuple(out)


def validate_layout(args: Sequence[ArgSpec], kernarg_size: int, where: str = "") -> None:
    """Sizes match types, offsets naturally aligned, no overlap, all inside kernarg_size."""
    pre = f"{where}: " if where else ""
    seen: set[str] = set()
    spans: list[tuple[int, int, str]] = []
    for a in args:
        if a.name in seen:
            raise KernargError(f"{pre}argument {a.name!r} appears twice")
        seen.add(a.name)
        if a.size != a.type.size:
            raise KernargError(f"{pre}argument {a.name!r}: size {a.size} but type "
                               f"{a.type.text} takes {a.type.size}")
        if a.offset < 0 or a.offset % a.size:
            raise KernargError(f"{pre}argument {a.name!r}: offset {a.offset} is not aligned "
                               f"to its size {a.size}")
        if a.offset + a.size > kernarg_size:
            raise KernargError(f"{pre}argument {a.name!r} ends at {a.offset + a.size}, past "
                               f"kernarg_size {kernarg_size}")
        spans.append((a.offset, a.offset + a.size, a.name))
    spans.sort()
    for (s0, e0, n0), (s1, _e1, n1) in zip(spans, spans[1:]):
        if s1 < e0:
            raise KernargError(f"{pre}arguments {n0!r} and {n1!r} overlap")


def peer_tables(args: Sequence[ArgSpec]) -> dict[str, list[str]]:
    """Runs of pointer args NAME_0..NAME_{k-1} (k >= 2, contiguous indices) -> member names."""
    key = id(args)
    hit = _PEER_TABLES.get(key)
    if hit is not None and hit[0] is args:  # a kernel's args never change: found once
        return hit[1]
    tables = _find_peer_tables(args)
    if isinstance(args, tuple):
        _PEER_TABLES[key] = (args, tables)
    return tables


_PEER_TABLES: dict[int, tuple[Any, dict[str, list[str]]]] = {}


def _find_peer_tables(args: Sequence[ArgSpec]) -> dict[str, list[str]]:
    groups: dict[str, dict[int, str]] = {}
    names = {a.name for a in args}
    for a in args:
        m = _TABLE_RE.match(a.name)
        if a.type.is_pointer and m and m.group(1) not in names:
            groups.setdefault(m.group(1), {})[int(m.group(2))] = a.name
    return {base: [g[i] for i in range(len(g))] for base, g in groups.items()
            if len(g) >= 2 and sorted(g) == list(range(len(g)))}


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
        if t.scalar is not None and dname not in _TORCH_DTYPES.get(t.scalar, set()):
            raise KernargError(f"argument {name!r}: tensor dtype {dname} does not match "
                               f"{t.text} (accepts {sorted(_TORCH_DTYPES[t.scalar])}; pass "
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


def _scalar_bytes(name: str, t: ArgType, v: Any) -> bytes:
    fmt, _size, lo, hi = _SCALARS[t.scalar]
    if _is_tensor(v):
        raise KernargError(f"argument {name!r} is a {t.text} scalar, got a tensor")
    if lo is not None:
        if isinstance(v, float) or isinstance(v, bool):
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
        return struct.pack(fmt, iv)
    try:
        fv = float(v)
    except (TypeError, ValueError):
        raise KernargError(f"argument {name!r}: {t.text} needs a number, got "
                           f"{type(v).__name__}") from None
    if t.scalar == "f32" and math.isfinite(fv) and abs(fv) > 3.4028234663852886e38:
        raise KernargError(f"argument {name!r}: {fv!r} overflows f32")
    return struct.pack(fmt, fv)


def expand_peer_tables(args: Sequence[ArgSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """Replace `NAME=[a0, a1, ...]` by NAME_0..NAME_{k-1}, padding with a0."""
    tables = peer_tables(args)
    out = dict(values)
    for base, members in tables.items():
        if base not in out:
            continue
        lst = out.pop(base)
        if not isinstance(lst, (list, tuple)):
            raise KernargError(f"argument {base!r} is the peer table {members[0]}.."
                               f"{members[-1]}: pass a list of up to {len(members)} addresses")
        if not 1 <= len(lst) <= len(members):
            raise KernargError(f"peer table {base!r} takes 1..{len(members)} entries, "
                               f"got {len(lst)}")
        clash = [m for m in members if m in out]
        if clash:
            raise KernargError(f"peer table {base!r} given both as a list and as {clash}")
        for i, m in enumerate(members):
            out[m] = lst[i] if i < len(lst) else lst[0]
    return out


def pack_args(args: Sequence[ArgSpec], kernarg_size: int, values: Mapping[str, Any], *,
              device: int | None = None, kernel: str = "kernel") -> bytes:
    vals = expand_peer_tables(args, values)
    names = {a.name for a in args}
    unknown = sorted(set(vals) - names)
    missing = [a.name for a in args if a.name not in vals]
    if unknown or missing:
        tables = peer_tables(args)
        hint = f"; peer tables: {sorted(tables)}" if tables else ""
        raise KernargError(f"{kernel}: missing arguments {missing}, unknown arguments "
                           f"{unknown} (expects {[a.name for a in args]}{hint})")
    buf = bytearray(kernarg_size)
    for a in args:
        v = vals[a.name]
        if a.type.is_pointer:
            if type(v) is int and 0 <= v < (1 << 64) and not v % min(a.type.pointee_bytes, 16):
                struct.pack_into("<Q", buf, a.offset, v)  # the common case, checked inline
                continue
            raw = struct.pack("<Q", _pointer_value(a.name, a.type, v, device))
        else:
            raw = _scalar_bytes(a.name, a.type, v)
        buf[a.offset:a.offset + a.size] = raw
    return bytes(buf)


def pack_kernargs(entry: Any, args: Mapping[str, Any], *, device: int | None = None) -> bytes:
    """Pack `args` (name -> value) for a manifest kernel entry (a KernelEntry or its JSON dict).

    Pointers: int device address, torch tensor (device and dtype checked), None (null), or
    for a peer table NAME_0..NAME_7 a list under NAME. Scalars are range-checked.
    """
    if isinstance(entry, Mapping):
        specs = arg_specs_from_json(entry["args"])
        return pack_args(specs, int(entry["kernarg_size"]), args, device=device,
                         kernel=str(entry.get("symbol", "kernel")))
    return pack_args(entry.args, entry.kernarg_size, args, device=device, kernel=entry.name)


def unpack_args(args: Sequence[ArgSpec], data: bytes) -> dict[str, int | float]:
    """The inverse, for tests and logs: name -> int address / int / float."""
    out: dict[str, int | float] = {}
    for a in args:
        fmt = "<Q" if a.type.is_pointer else _SCALARS[a.type.scalar][0]
        out[a.name] = struct.unpack_from(fmt, data, a.offset)[0]
    return out


# ---- launch-time helpers shared by the CUDA and HIP loaders (pure ctypes) ----------------

def dim3(v: int | Iterable[int], what: str) -> tuple[int, int, int]:
    dims = (v,) if isinstance(v, int) else tuple(int(x) for x in v)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"{what} must have 1 to 3 dimensions, got {v!r}")
    dims = dims + (1,) * (3 - len(dims))
    if any(d < 1 or d >= (1 << 32) for d in dims):
        raise ValueError(f"{what} dimensions must be in [1, 2^32), got {dims}")
    return dims  # type: ignore[return-value]


class LaunchBuffer:
    """Host memory holding packed kernargs for launch calls.

    `extra(ptr_tag, size_tag, end_tag)` gives the address of a void*[5] array
    {BUFFER_POINTER, &buf, BUFFER_SIZE, &size, END}; `params(offsets)` the address of a
    void*[n] array of pointers into the buffer (CUDA's kernelParams form). Both driver APIs
    copy the arguments during the launch call, so the buffer may die, or be refilled in
    place through `storage` for the next launch, right after it (`data` is then stale).
    """

    def __init__(self, data: bytes):
        self.data = bytes(data)
        # 16-byte aligned storage: some drivers read the kernarg buffer with wide loads.
        n = max(len(self.data), 1)
        self._store = (ctypes.c_uint64 * ((n + 15) // 8))()
        ctypes.memmove(self._store, self.data, len(self.data))
        self.address = ctypes.addressof(self._store)
        self.storage = self._store  # writable in place: PackPlan.fill targets it
        self._size = ctypes.c_size_t(len(self.data))
        self._keep: list[Any] = []

    def extra(self, ptr_tag: int, size_tag: int, end_tag: int) -> int:
        arr = (ctypes.c_void_p * 5)(ptr_tag, self.address, size_tag,
                                    ctypes.addressof(self._size), end_tag)
        self._keep.append(arr)
        return ctypes.addressof(arr)

    def params(self, offsets: Sequence[int]) -> int:
        arr = (ctypes.c_void_p * max(len(offsets), 1))(*[self.address + o for o in offsets])
        self._keep.append(arr)
        return ctypes.addressof(arr)


def read_extra(address: int) -> tuple[list[int], bytes]:
    """Decode an `extra` array (for fakes in tests): (the 5 raw words, the buffer bytes)."""
    words = [w or 0 for w in (ctypes.c_void_p * 5).from_address(address)]
    size = ctypes.c_size_t.from_address(words[3]).value
    return words, ctypes.string_at(words[1], size)


def read_params(address: int, sizes: Sequence[int]) -> list[bytes]:
    """Decode a kernelParams array (for fakes in tests): the bytes each entry points at."""
    ptrs = (ctypes.c_void_p * len(sizes)).from_address(address)
    return [ctypes.string_at(p, s) for p, s in zip(ptrs, sizes)]
