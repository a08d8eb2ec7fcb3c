"""Kernel-argument layouts: the types, offsets and peer tables a manifest records, and the
host buffers the CUDA and HIP loaders launch from. Packing values into these layouts has one
implementation, `packplan.PackPlan` (the checked and the trusted path both).

Argument types (as the lowering writes them): scalars `i32`, `i64`, `f32`; pointers
`ptr<ELEM,SPACE>` with ELEM a scalar (`bf16`) or a vector (`bf16x8`). A peer-pointer table
is a run of pointer args `NAME_0 .. NAME_{k-1}`; the caller may pass `NAME=[addr, ...]`
(up to k entries, padded with the first so unused slots still point at valid memory).
Manifest args may also carry what the DSL declared (added at build time, all optional):
`role` (ptr | peer_ptrs | registered_ptrs | scalar | call_id), `param` (the DSL parameter a
peer-table member belongs to), `align` (bytes the address must be a multiple of: 16 where
the kernel accesses 16-byte packs through it) and `elem` (a RegisteredPtrs table's pointee).
"""
from __future__ import annotations

import ctypes
import dataclasses
import re
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
TORCH_DTYPES = {
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
_TORCH_DTYPES = TORCH_DTYPES
ROLES = ("ptr", "peer_ptrs", "registered_ptrs", "scalar", "call_id")
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
    role: str = ""    # what the DSL declared (ROLES); "" where the manifest does not say
    param: str = ""   # the DSL parameter (a peer table's base name for its members)
    align: int = 0    # required address alignment in bytes; 0: not recorded
    elem: str = ""    # a registered_ptrs table's pointee type (the table itself is ptr<i64>)


def arg_specs_from_json(args: Sequence[Mapping[str, Any]]) -> tuple[ArgSpec, ...]:
    out = []
    for i, a in enumerate(args):
        missing = [k for k in ("name", "type", "offset", "size") if k not in a]
        if missing:
            raise KernargError(f"argument #{i} ({a.get('name', '?')}) lacks {missing}")
        role, align = str(a.get("role", "")), int(a.get("align", 0))
        if role and role not in ROLES:
            raise KernargError(f"argument {a['name']!r}: unknown role {role!r} (one of {ROLES})")
        if align < 0 or align & (align - 1):
            raise KernargError(f"argument {a['name']!r}: align {align} is not a power of two")
        out.append(ArgSpec(str(a["name"]), parse_type(str(a["type"])), int(a["offset"]),
                           int(a["size"]), role, str(a.get("param", "")), align,
                           str(a.get("elem", ""))))
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
    declared = any(a.role for a in args)  # the build recorded the DSL's roles: trust them
    for a in args:
        m = _TABLE_RE.match(a.name)
        if not (a.type.is_pointer and m) or (declared and a.role != "peer_ptrs"):
            continue
        base = (a.param or m.group(1)) if declared else m.group(1)
        if base not in names:
            groups.setdefault(base, {})[int(m.group(2))] = a.name
    return {base: [g[i] for i in range(len(g))] for base, g in groups.items()
            if len(g) >= 2 and sorted(g) == list(range(len(g)))}


def __getattr__(name: str) -> Any:
    """The packing functions moved to packplan.py (the one implementation); old imports of
    them from here keep working."""
    if name in ("pack_args", "pack_kernargs", "unpack_args", "expand_peer_tables"):
        from . import packplan
        return getattr(packplan, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
