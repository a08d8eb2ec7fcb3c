"""Kernel signatures for the launch checks (launch_args.py): what each parameter of a kernel
is, read from a manifest entry (`signature_from_entry`, the GPU) or from a DSL kernel and its
trace (`signature_from_kernel`, the simulator), so both check the same facts.

What the checks need beyond the types is recorded at build time (`annotate_args`, additive
fields of the manifest's args): each parameter's DSL role (Ptr, PeerPtrs, RegisteredPtrs,
scalar) and the alignment the kernel relies on: 16 bytes where it accesses 16-byte packs
through the pointer (found in the IR by `pointer_alignment`: a load/store through a pointer
cast to a 16-byte vector). A manifest without them is checked conservatively (16 bytes for
every pointer).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from .kernarg import parse_type, peer_tables

__all__ = ["Param", "Signature", "signature_from_entry", "signature_from_kernel",
           "annotate_args", "pointer_alignment", "PACK_BYTES"]

PACK_BYTES = 16         # the widest access a kernel makes (one 16-byte pack)
_KINDS = {"one": "ptr", "by_value": "peer_ptrs", "in_memory": "registered_ptrs"}
DECLARED = {"ptr": "Ptr", "peer_ptrs": "PeerPtrs", "registered_ptrs": "RegisteredPtrs"}


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
        return f"{DECLARED[self.kind]}[{elem}]"


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
