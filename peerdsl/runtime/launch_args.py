"""A user launch's arguments checked against the kernel's signature, the same on every backend.

The GPU communicator reads the signature from the kernel's manifest entry
(`signature_from_entry`), the simulator from the DSL kernel and its trace
(`signature_from_kernel`); both then call `check_args` and `check_grid`, so a wrong launch
fails the same way everywhere, before anything runs, with an error that names the argument,
what it got and what the kernel declares.

What the checks need beyond the types is recorded at build time (`annotate_args`, additive
fields of the manifest's args): each parameter's DSL role (Ptr, PeerPtrs, RegisteredPtrs,
scalar) and the alignment the kernel relies on: 16 bytes where it accesses 16-byte packs
through the pointer (found in the IR: a load/store through a pointer cast to a 16-byte
vector). A manifest without them is checked conservatively (16 bytes for every pointer).
"""
from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from .kernarg import KernargError, TORCH_DTYPES, parse_type, peer_tables
from .peer_buffers import PeerBuffer

__all__ = ["LaunchArgError", "Param", "Signature", "signature_from_entry",
           "signature_from_kernel", "annotate_args", "pointer_alignment", "check_args",
           "check_grid"]

PACK_BYTES = 16         # the widest access a kernel makes (one 16-byte pack)
_F32_MAX = 3.4028234663852886e38
_INT_RANGE = {"i32": (-(1 << 31), (1 << 31) - 1), "i64": (-(1 << 63), (1 << 63) - 1)}
_KINDS = {"one": "ptr", "by_value": "peer_ptrs", "in_memory": "registered_ptrs"}
_DECLARED = {"ptr": "Ptr", "peer_ptrs": "PeerPtrs", "registered_ptrs": "RegisteredPtrs"}


class LaunchArgError(KernargError, TypeError):
    """A launch argument does not fit the kernel's signature (or the grid its limits)."""


@dataclasses.dataclass(frozen=True)
class Param:
    name: str        # the DSL parameter (a PeerPtrs table by its base name)
    kind: str        # ptr | peer_ptrs | registered_ptrs | scalar | call_id
    dtype: str       # scalars: i32 i64 f32; pointers: the pointee's element ("" untyped)
    lanes: int = 1   # lanes of the declared pointee (Ptr[bf16x8] -> 8)
    align: int = 1   # bytes every address passed (the pointees, for RegisteredPtrs) needs
    peers: int = 0   # entries of a PeerPtrs table

    @property
    def declared(self) -> str:
        if self.kind in ("scalar", "call_id"):
            return self.dtype
        elem = (self.dtype or "untyped") + (f"x{self.lanes}" if self.lanes > 1 else "")
        return f"{_DECLARED[self.kind]}[{elem}]"


@dataclasses.dataclass(frozen=True)
class Signature:
    kernel: str                 # for messages: the name and its constexprs
    params: tuple[Param, ...]

    @property
    def synchronizes(self) -> bool:
        """A kernel that reaches its peers waits for them: every rank launches it, with
        every block resident at once."""
        return any(p.kind in ("peer_ptrs", "registered_ptrs") for p in self.params)

    @property
    def runtime_filled(self) -> list[str]:
        return [p.name for p in self.params if p.kind == "call_id"]


def _label(name: str, constexprs: Mapping[str, Any]) -> str:
    inner = ", ".join(f"{k}={getattr(v, 'name', v)}" for k, v in constexprs.items())
    return f"{name}[{inner}]" if inner else name


# ---------------------------------------------------------------------- signatures
def signature_from_entry(entry: Any, kernel: Any = None) -> Signature:
    """The signature of a manifest entry (KernelEntry). Roles come from the manifest; where
    it records none, from the DSL `kernel` if given, else from the types alone (a peer table
    is a run NAME_0..NAME_k). Alignment not recorded is taken as 16 bytes (conservative)."""
    args = entry.args
    declared = _declared_kinds(kernel, entry.constexprs) if (
        kernel is not None and not any(a.role for a in args)) else {}
    tables = peer_tables(args)
    member = {m: base for base, ms in tables.items() for m in ms}
    params, done = [], set()
    for a in args:
        if a.name in member:
            base = member[a.name]
            if base not in done:
                done.add(base)
                ms = [x for x in args if x.name in tables[base]]
                params.append(Param(base, "peer_ptrs", a.type.scalar or "", a.type.vector,
                                    max(m.align for m in ms) or PACK_BYTES, len(ms)))
            continue
        role = a.role or declared.get(a.name, ("", ""))[0]
        if role == "registered_ptrs":
            elem = a.elem or declared.get(a.name, ("", ""))[1]
            t = parse_type(f"ptr<{elem}>") if elem else None
            params.append(Param(a.name, role, t.scalar if t else "", t.vector if t else 1,
                                a.align or PACK_BYTES))
        elif role == "call_id":
            params.append(Param(a.name, role, a.type.scalar or ""))
        elif a.type.is_pointer:
            params.append(Param(a.name, "ptr", a.type.scalar or "", a.type.vector,
                                a.align or PACK_BYTES))
        else:
            params.append(Param(a.name, "scalar", a.type.scalar))
    return Signature(_label(entry.op, entry.constexprs), tuple(params))


def _declared_kinds(kernel: Any, constexprs: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """{parameter: (role, pointee)} from a DSL kernel's annotations (no trace needed)."""
    from ..dsl.kernel import _PtrAnnotation, dtype_of
    out = {}
    for name, p in kernel.signature.parameters.items():
        ann = p.annotation
        if isinstance(ann, _PtrAnnotation):
            elem = constexprs.get(ann.elem, ann.elem) if isinstance(ann.elem, str) else ann.elem
            out[name] = (_KINDS[ann.kind], str(dtype_of(elem)))
        elif _is_call_id(ann):
            out[name] = ("call_id", "")
    return out


def _is_call_id(ann: Any) -> bool:
    """A runtime-filled call identity parameter (dsl.CallId, added by the faults work): the
    caller never passes it. Recognized by its declared role, so no import is needed here."""
    return getattr(ann, "role", None) == "call_id" or getattr(ann, "__name__", "") == "CallId" \
        or type(ann).__name__ == "CallId"


def signature_from_kernel(kernel: Any, traced: Any) -> Signature:
    """The signature of a DSL kernel traced with its constexprs (`traced = kernel.trace(...)`):
    roles and pointee types from the annotations, alignment from the IR."""
    from ..dsl import ir
    from ..dsl.kernel import _PtrAnnotation, dtype_of
    direct, via_table = pointer_alignment(traced)
    types = {p.name: p.type for p in traced.params}
    params = []
    for name, p in kernel.signature.parameters.items():
        if name in kernel.constexpr_names:
            continue
        ann = p.annotation
        if isinstance(ann, _PtrAnnotation):
            elem = traced.constexprs[ann.elem] if isinstance(ann.elem, str) else ann.elem
            t = dtype_of(elem)
            scalar, lanes = (t.elem, t.count) if isinstance(t, ir.VectorType) else (t, 1)
            kind = _KINDS[ann.kind]
            if kind == "peer_ptrs":
                members = [m for m in types if m.startswith(name + "_")
                           and m[len(name) + 1:].isdigit()]
                need = max([direct.get(m, 1) for m in members] + [1])
                peers = len(members)
            elif kind == "registered_ptrs":
                need, peers = via_table.get(name, 1), 0
            else:
                need, peers = direct.get(name, 1), 0
            align = min(PACK_BYTES, max(t.nbytes, need))
            params.append(Param(name, kind, scalar.name, lanes, align, peers))
        elif _is_call_id(ann):
            params.append(Param(name, "call_id", getattr(types.get(name), "name", "i32")))
        else:
            params.append(Param(name, "scalar", types[name].name))
    return Signature(_label(kernel.name, traced.constexprs), tuple(params))


def pointer_alignment(traced: Any) -> tuple[dict[str, int], dict[str, int]]:
    """The widest access (bytes, at most 16) the kernel makes through each pointer parameter:
    ({IR parameter: bytes} for pointers passed directly, {RegisteredPtrs parameter: bytes}
    for the pointers it reads from its table). Follows pointers through ptr_offset,
    ptr_cast, ptr_select and select, loop-carried values, and a table's int_to_ptr."""
    from ..dsl import ir
    origin: dict[int, set[tuple[str, bool]]] = {}   # value id -> {(param, through a table)}
    loaded: dict[int, set[str]] = {}                 # i64 read through a param -> params
    for p in traced.params:
        if isinstance(p.type, ir.PtrType):
            origin[p.value.id] = {(p.name, False)}
    direct: dict[str, int] = {}
    via_table: dict[str, int] = {}

    def of(v: Any) -> set[tuple[str, bool]]:
        return origin.get(v.id, set())

    def access(ptr: Any) -> None:
        width = min(PACK_BYTES, ptr.type.elem.nbytes)
        for name, table in of(ptr):
            d = via_table if table else direct
            d[name] = max(d.get(name, 1), width)

    for op in traced.walk():
        n = op.name
        if n in ("ptr_offset", "ptr_cast"):
            origin[op.result.id] = set(of(op.operands[0]))
        elif n in ("ptr_select", "select") and op.results and isinstance(
                op.result.type, ir.PtrType):
            origin[op.result.id] = set().union(*(of(v) for v in op.operands[1:]))
        elif n == "int_to_ptr":
            origin[op.result.id] = {(name, True) for name in loaded.get(op.operands[0].id, ())}
        elif n in ("for", "while", "if"):
            carried = set().union(*(of(v) for v in op.operands))
            for v in list(op.results) + [a for r in op.regions for a in r.args]:
                if isinstance(v.type, ir.PtrType):
                    origin[v.id] = set(carried)
        if n in ("load", "store", "atomic", "cas") and op.operands[0].id in origin:
            if n == "load" and op.result.type == ir.i64:  # maybe an address from a table
                loaded[op.result.id] = {name for name, table in of(op.operands[0])
                                        if not table}
            access(op.operands[0])
    return direct, via_table


def annotate_args(args: Sequence[Mapping[str, Any]], kernel: Any, traced: Any) -> list[dict]:
    """The manifest's args of a built kernel with what the launch checks need (additive
    fields): role, param (a peer-table member's DSL parameter), align, and for a
    RegisteredPtrs table its pointee type (elem). Called by the build on every entry."""
    sig = signature_from_kernel(kernel, traced)
    by_ir: dict[str, Param] = {}
    for p in sig.params:
        if p.kind == "peer_ptrs":
            by_ir.update({f"{p.name}_{i}": p for i in range(p.peers)})
        else:
            by_ir[p.name] = p
    out = []
    for a in args:
        a = dict(a)
        p = by_ir.get(a["name"])
        if p is not None:
            a["role"] = p.kind
            if p.kind == "peer_ptrs":
                a["param"] = p.name
            if p.kind in ("ptr", "peer_ptrs", "registered_ptrs"):
                a["align"] = p.align
            if p.kind == "registered_ptrs":
                a["elem"] = p.dtype + (f"x{p.lanes}" if p.lanes > 1 else "")
        out.append(a)
    return out


# ---------------------------------------------------------------------- checks
def describe(v: Any) -> str:
    """A value as an error message shows it."""
    if _is_tensor(v):
        return (f"a {str(v.dtype).replace('torch.', '')} tensor of shape {tuple(v.shape)} on "
                f"{v.device}")
    if isinstance(v, PeerBuffer):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return f"a {type(v).__name__} of {len(v)} values"
    if isinstance(v, (bool, int, float, str)):
        return f"{type(v).__name__} {v!r}"
    return f"a {type(v).__name__}"


def _is_tensor(v: Any) -> bool:
    return type(v).__module__.split(".")[0] == "torch" and hasattr(v, "data_ptr")


def check_args(sig: Signature, args: Mapping[str, Any], implicit: Mapping[str, Any], *,
               device: Any, sim: bool = False) -> dict[str, Any]:
    """Check the user's `args` against `sig` and return them merged with the runtime-filled
    `implicit` ones (scalars normalized to int/float). `device`: where tensors must be (a
    torch.device); `sim`: the simulator, whose tensors are CPU tensors. Raises one
    LaunchArgError listing every problem."""
    names = [p.name for p in sig.params]
    runtime = set(sig.runtime_filled)
    passed_runtime = sorted(runtime & set(args))
    missing = [n for n in names if n not in args and n not in runtime]
    unknown = sorted(set(args) - set(names))
    if missing or unknown or passed_runtime:
        parts = []
        if missing:
            parts.append(f"missing arguments {missing}")
        if unknown:
            parts.append(f"unknown arguments {unknown}")
        if passed_runtime:
            parts.append(f"{passed_runtime} are filled by the runtime: do not pass them")
        expects = ", ".join(f"{p.name}: {p.declared}" for p in sig.params if p.name not in runtime)
        raise LaunchArgError(f"{sig.kernel}: {'; '.join(parts)} (the kernel takes {expects})")
    merged = {**args, **implicit}
    problems, out = [], {}
    for p in sig.params:
        if p.name not in merged:
            problems.append(f"argument {p.name!r} is filled by the runtime, which gave no value "
                            "(no call identity hook yet)")
            continue
        v = merged[p.name]
        try:
            out[p.name] = _check_one(p, v, device, sim)
        except LaunchArgError as e:
            problems.append(f"argument {p.name!r} got {describe(v)}; the kernel declares "
                            f"{p.declared}: {e}")
    if problems:
        raise LaunchArgError(f"{sig.kernel}: " + "\n  ".join(problems))
    return out


def _check_one(p: Param, v: Any, device: Any, sim: bool) -> Any:
    if p.kind in ("scalar", "call_id"):
        return _scalar(p, v)
    if p.kind == "peer_ptrs":
        if isinstance(v, PeerBuffer):
            _dtype(p, v.dtype)
            entries = list(v.addresses)
        elif isinstance(v, (list, tuple)):
            entries = [_address(p, a) for a in v]
        elif _is_tensor(v):
            raise LaunchArgError("a PeerPtrs parameter takes every rank's address: pass "
                                 "comm.register(tensor) (collective) or comm.peer_buffer(shape, "
                                 "dtype)")
        else:
            raise LaunchArgError("pass a PeerBuffer (comm.register / comm.peer_buffer / "
                                 "comm.signal) or a list of addresses")
        if not 1 <= len(entries) <= p.peers:
            raise LaunchArgError(f"a table of 1..{p.peers} addresses, got {len(entries)}")
        for a in entries:
            _aligned(p, a)
        return v
    if v is None and p.kind == "ptr":
        return None  # an explicit null (optional buffers)
    if _is_tensor(v):
        _tensor(p, v, device, sim)
        return v
    if isinstance(v, PeerBuffer):
        _dtype(p, v.dtype)
        return v
    if isinstance(v, (list, tuple)):
        raise LaunchArgError(f"a {_DECLARED[p.kind]} takes one buffer; a list of addresses is "
                             "for PeerPtrs")
    addr = _address(p, v)
    if p.kind == "ptr":
        _aligned(p, addr)
    elif addr % 8:
        raise LaunchArgError(f"a table address must be 8-byte aligned, got {addr:#x}")
    return addr


def _scalar(p: Param, v: Any) -> int | float:
    if _is_tensor(v):
        raise LaunchArgError("pass a Python number (t.item()), not a tensor")
    if isinstance(v, bool) or type(v).__name__ in ("bool_", "bool"):  # numpy's too
        raise LaunchArgError(f"a bool is not a {p.dtype}: pass int({v!r})")
    if p.dtype in _INT_RANGE:
        try:
            iv = operator.index(v)
        except TypeError:
            hint = f" (int({v!r}) truncates)" if isinstance(v, float) else ""
            raise LaunchArgError(f"{p.dtype} needs an int{hint}") from None
        lo, hi = _INT_RANGE[p.dtype]
        if not lo <= iv <= hi:
            raise LaunchArgError(f"{iv} is out of range for {p.dtype} [{lo}, {hi}]")
        return iv
    if isinstance(v, str):
        raise LaunchArgError(f"{p.dtype} needs a number")
    try:
        fv = float(v)
    except (TypeError, ValueError):
        raise LaunchArgError(f"{p.dtype} needs a number") from None
    if math.isfinite(fv) and abs(fv) > _F32_MAX:
        raise LaunchArgError(f"{fv!r} overflows f32")
    return fv


def _dtype(p: Param, dtype: Any) -> None:
    name = str(dtype).replace("torch.", "")
    if p.dtype and name not in TORCH_DTYPES.get(p.dtype, set()):
        raise LaunchArgError(f"its dtype {name} is not the declared element {p.dtype} "
                             f"(accepts {sorted(TORCH_DTYPES.get(p.dtype, ()))})")


def _tensor(p: Param, t: Any, device: Any, sim: bool) -> None:
    if sim:
        if t.device.type != "cpu":
            raise LaunchArgError("on the simulator pass CPU tensors (results are copied back "
                                 "into them)")
    elif t.device.type != device.type or (t.device.index is not None and device.index
                                          is not None and t.device.index != device.index):
        raise LaunchArgError(f"the tensor is on {t.device}; this communicator runs on {device}")
    _dtype(p, t.dtype)
    if not t.is_contiguous():
        raise LaunchArgError(f"not contiguous (strides {t.stride()}): pass t.contiguous()")
    _aligned(p, t.data_ptr(), "its data starts at")


def _address(p: Param, v: Any) -> int:
    if isinstance(v, (bool, float)):
        raise LaunchArgError("not an address")
    try:
        addr = operator.index(v)
    except TypeError:
        raise LaunchArgError("expected a tensor, a PeerBuffer or an int address") from None
    if not 0 <= addr < (1 << 64):
        raise LaunchArgError(f"{addr:#x} is not a 64-bit address")
    return addr


def _aligned(p: Param, addr: int, what: str = "address") -> None:
    if addr % p.align:
        why = " (the kernel accesses 16-byte packs through it)" if p.align == PACK_BYTES else ""
        raise LaunchArgError(f"{what} {addr:#x}, not {p.align}-byte aligned{why}")


def check_grid(sig: Signature, grid: Any, cap: int | None) -> int:
    """The grid as an int, checked: positive, and for a kernel that synchronizes at most
    `cap` blocks (every block of every rank must be resident at once)."""
    if isinstance(grid, bool) or isinstance(grid, float):
        raise LaunchArgError(f"{sig.kernel}: grid must be a positive int, got {describe(grid)}")
    try:
        g = operator.index(grid)
    except TypeError:
        raise LaunchArgError(f"{sig.kernel}: grid must be a positive int (the DSL's block_id "
                             f"is one-dimensional), got {describe(grid)}") from None
    if g < 1 or g >= 1 << 31:
        raise LaunchArgError(f"{sig.kernel}: grid {g} is not in [1, 2^31)")
    if cap is not None and sig.synchronizes and g > cap:
        raise LaunchArgError(
            f"{sig.kernel}: grid {g} exceeds {cap}, the blocks that can be resident at once "
            "here; a kernel that synchronizes with its peers needs every block of every rank "
            f"running together: launch at most {cap} blocks (a grid-stride loop covers the rest)")
    return g
