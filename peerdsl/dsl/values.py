"""Traced values with Python operators: scalars, 16-byte vector packs and pointers.

Arithmetic never changes precision silently: both sides must have the same type, except
that a Python int or float literal takes the type of the traced side. Conversions are
explicit (`to_f32`, `to_bf16`, ...) and say how they round.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import ir
from .builder import TraceError, emit, state, user_location


_FLOAT_NP = {"f32": np.float32, "f16": np.float16, "bf16": np.float32}


class Traced:
    __slots__ = ("v",)

    def __init__(self, v: ir.Value):
        self.v = v

    @property
    def type(self) -> Any:
        return self.v.type

    def __bool__(self) -> bool:
        raise TraceError(
            f"{user_location()}: a traced {self.type} value was used where Python needs a bool "
            "(in `if`/`while`/`and`/`or`/`not` outside a kernel-transformed function, or in a "
            "Python builtin). Use it inside a @kernel or helper so control flow is traced, or "
            "make the value a constexpr.")

    def __iter__(self):
        raise TraceError(f"{user_location()}: cannot iterate over a traced {self.type} value")

    def __index__(self) -> int:
        raise TraceError(f"{user_location()}: a traced {self.type} value cannot be used as a "
                         "Python index; index a pointer (p[i]) or use a constexpr")


def wrap(v: ir.Value) -> Traced:
    t = v.type
    if isinstance(t, ir.PtrType):
        return Pointer(v)
    if isinstance(t, ir.VectorType):
        return Vector(v)
    return Scalar(v)


def const(value: Any, type_: ir.ScalarType) -> "Scalar":
    if type_.is_float:
        # rounded once to the constant's type here, so every consumer sees the same bits
        value = float(_FLOAT_NP[type_.name](value))
    elif type_ is ir.i1:
        value = bool(value)
    else:
        value = int(value)
        lo, hi = (-(1 << (type_.bits - 1)), (1 << type_.bits) - 1)
        if not lo <= value <= hi:
            raise TraceError(f"{user_location()}: constant {value} does not fit {type_}")
    return Scalar(emit("const", [], [type_], value=value).result)


def as_scalar(x: Any, like: ir.ScalarType | None = None) -> "Scalar":
    """A traced scalar for x; Python literals take the type `like` (default i32 / f32)."""
    if isinstance(x, Scalar):
        return x
    if isinstance(x, Traced):
        raise TraceError(f"{user_location()}: expected a scalar, got {x.type}")
    if isinstance(x, bool):
        return const(x, ir.i1)
    if isinstance(x, int):
        return const(x, like if like is not None else ir.i32)
    if isinstance(x, float):
        if like is not None and not like.is_float:
            raise TraceError(f"{user_location()}: float literal {x} mixed with {like}")
        return const(x, like if like is not None else ir.f32)
    raise TraceError(f"{user_location()}: cannot use {type(x).__name__} {x!r} in a kernel")


def _binary(name: str, a: Any, b: Any) -> "Scalar":
    if not isinstance(a, Scalar):
        a = as_scalar(a, b.type if isinstance(b, Scalar) else None)
    b = as_scalar(b, a.type)
    if a.type != b.type:
        raise TraceError(f"{user_location()}: {name} of {a.type} and {b.type}; convert one "
                         "explicitly (e.g. .to_f32(), .to_i64())")
    if name in ("and", "or", "xor", "shl", "shr") and a.type.is_float:
        raise TraceError(f"{user_location()}: bitwise {name} on float {a.type}")
    if a.type in (ir.bf16, ir.f16) and name not in ("min", "max"):
        raise TraceError(f"{user_location()}: arithmetic in {a.type} is not allowed by the "
                         "numerics contract; convert with .to_f32() first")
    return Scalar(emit(name, [a.v, b.v], [a.type]).result)


def _compare(pred: str, a: Any, b: Any) -> "Scalar":
    if not isinstance(a, Scalar):
        a = as_scalar(a, b.type)
    b = as_scalar(b, a.type)
    if a.type != b.type:
        raise TraceError(f"{user_location()}: comparing {a.type} with {b.type}")
    return Scalar(emit("cmp", [a.v, b.v], [ir.i1], pred=pred).result)


class Scalar(Traced):
    __slots__ = ()

    # arithmetic
    def __add__(self, o): return _binary("add", self, o)
    def __radd__(self, o): return _binary("add", o, self)
    def __sub__(self, o): return _binary("sub", self, o)
    def __rsub__(self, o): return _binary("sub", o, self)
    def __mul__(self, o): return _binary("mul", self, o)
    def __rmul__(self, o): return _binary("mul", o, self)
    def __truediv__(self, o): return _binary("div", self, o)
    def __rtruediv__(self, o): return _binary("div", o, self)

    def __floordiv__(self, o):
        if self.type.is_float:
            raise TraceError(f"{user_location()}: // on {self.type}; use / for floats")
        return _binary("div", self, o)

    def __rfloordiv__(self, o): return as_scalar(o, self.type) // self
    def __mod__(self, o): return _binary("rem", self, o)
    def __rmod__(self, o): return _binary("rem", o, self)
    def __and__(self, o): return _binary("and", self, o)
    def __rand__(self, o): return _binary("and", o, self)
    def __or__(self, o): return _binary("or", self, o)
    def __ror__(self, o): return _binary("or", o, self)
    def __xor__(self, o): return _binary("xor", self, o)
    def __rxor__(self, o): return _binary("xor", o, self)
    def __lshift__(self, o): return _binary("shl", self, o)
    def __rshift__(self, o): return _binary("shr", self, o)
    def __neg__(self): return Scalar(emit("neg", [self.v], [self.type]).result)
    def __invert__(self): return Scalar(emit("not", [self.v], [self.type]).result)

    # comparisons (return i1)
    def __lt__(self, o): return _compare("lt", self, o)
    def __le__(self, o): return _compare("le", self, o)
    def __gt__(self, o): return _compare("gt", self, o)
    def __ge__(self, o): return _compare("ge", self, o)
    def __eq__(self, o): return _compare("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return _compare("ne", self, o)  # type: ignore[override]
    __hash__ = None  # type: ignore[assignment]

    # conversions
    def _cast(self, kind: str, to: ir.ScalarType, **attrs) -> "Scalar":
        return Scalar(emit("cast", [self.v], [to], kind=kind, **attrs).result)

    def to(self, to: ir.ScalarType) -> "Scalar":
        """Numeric conversion; float narrowing rounds to nearest even."""
        src = self.type
        if src == to:
            return self
        if src.is_int and to.is_int:
            if to is ir.i1:
                return self != 0
            if src is ir.i1:
                return self._cast("zext", to)  # true is 1, not -1
            return self._cast("sext" if to.bits > src.bits else "trunc", to)
        if src.is_int and to.is_float:
            f = self._cast("sitofp", ir.f32)
            return f.to(to)
        if src.is_float and to.is_int:
            return self.to(ir.f32)._cast("fptosi", to)
        if to.bits > src.bits:
            return self._cast("extf", to)
        if src is ir.f32:
            return self._cast("truncf", to)
        return self.to(ir.f32).to(to)

    def to_f32(self) -> "Scalar": return self.to(ir.f32)
    def to_bf16(self) -> "Scalar": return self.to(ir.bf16)
    def to_f16(self) -> "Scalar": return self.to(ir.f16)
    def to_i32(self) -> "Scalar": return self.to(ir.i32)
    def to_i64(self) -> "Scalar": return self.to(ir.i64)

    def zext(self, to: ir.ScalarType) -> "Scalar":
        return self._cast("zext", to)

    def bitcast(self, to: ir.ScalarType) -> "Scalar":
        if to.bits != self.type.bits:
            raise TraceError(f"{user_location()}: bitcast {self.type} -> {to} changes size")
        return self._cast("bitcast", to)


class Vector(Traced):
    """A 16-byte (or smaller) pack such as bf16x8, f16x8 or f32x4."""
    __slots__ = ()

    def __len__(self) -> int:
        return self.type.count

    def __getitem__(self, i: int) -> Scalar:
        if not isinstance(i, int) or not 0 <= i < self.type.count:
            raise TraceError(f"{user_location()}: pack index {i!r} must be a constant in "
                             f"[0, {self.type.count})")
        return Scalar(emit("vec_extract", [self.v], [self.type.elem], index=i).result)

    def elements(self) -> list[Scalar]:
        return [self[i] for i in range(self.type.count)]

    def to_f32(self) -> list[Scalar]:
        return [e.to_f32() for e in self.elements()]

    def bitcast(self, to: ir.VectorType) -> "Vector":
        """The same bytes seen as another vector type (e.g. an LL line i32x4 as bf16x8)."""
        if not isinstance(to, ir.VectorType) or to.nbytes != self.type.nbytes:
            raise TraceError(f"{user_location()}: bitcast {self.type} -> {to} changes size")
        return Vector(emit("cast", [self.v], [to], kind="bitcast").result)


def pack(elements: Sequence[Any], elem: ir.ScalarType) -> Vector:
    vals = [as_scalar(e, elem) for e in elements]
    for e in vals:
        if e.type != elem:
            raise TraceError(f"{user_location()}: pack of {elem} got a {e.type} element; "
                             "convert explicitly")
    vt = ir.VectorType(elem, len(vals))
    return Vector(emit("vec_build", [e.v for e in vals], [vt]).result)


class Pointer(Traced):
    """A typed global or shared pointer. `p + i` and `p[i]` count elements.

    `peer` marks a pointer taken from a peer table with an index that is not this rank's
    own (so possibly another rank's memory); it follows pointer arithmetic and casts, and
    `dsl.store` refuses a plain (unscoped) store through it. `streaming` (set by
    `dsl.streaming`) makes `p[i]` reads and writes nontemporal; it follows them too. Neither
    survives a value carried out of control flow (an if, a loop, a select: a new value).
    """
    __slots__ = ("peer", "streaming")

    def __init__(self, v: ir.Value, peer: bool = False, streaming: bool = False):
        super().__init__(v)
        self.peer = peer
        self.streaming = streaming

    @property
    def elem(self):
        return self.type.elem

    def __add__(self, idx) -> "Pointer":
        idx = as_scalar(idx)
        if idx.type not in (ir.i32, ir.i64):
            raise TraceError(f"{user_location()}: pointer offset must be i32 or i64, got {idx.type}")
        return Pointer(emit("ptr_offset", [self.v, idx.v], [self.type]).result, self.peer,
                       self.streaming)

    __radd__ = __add__

    def cast(self, elem) -> "Pointer":
        return Pointer(emit("ptr_cast", [self.v], [ir.PtrType(elem, self.type.space)]).result,
                       self.peer, self.streaming)

    def __getitem__(self, idx) -> Any:
        from .memory import load
        return load(self + idx, nontemporal=self.streaming)

    def __setitem__(self, idx, value) -> None:
        from .memory import store
        store(self + idx, value, nontemporal=self.streaming)


def streaming(p: Pointer) -> Pointer:
    """`p` for data a kernel touches once (an input read once, an output the next kernels
    do not read soon): its `[i]` accesses are nontemporal, so the target may keep other
    data in its caches instead (sm_90: `ld/st.global.cs` for 16-byte accesses; AMD: the
    `nt` bit). Values and bytes are unchanged."""
    if not isinstance(p, Pointer):
        got = p.type if isinstance(p, Traced) else type(p).__name__
        raise TraceError(f"{user_location()}: dsl.streaming takes a pointer, got {got}")
    return Pointer(p.v, p.peer, True)


def declare_own_rank(rank: Any) -> None:
    """Record that the traced value `rank` is this rank's index: a peer table indexed with it
    gives this rank's own memory (the kernel's `rank` parameter, a Signal's rank)."""
    if isinstance(rank, Scalar):
        state().own_ranks.add(rank.v.id)


def is_own_rank(rank: Any) -> bool:
    return isinstance(rank, Scalar) and rank.v.id in state().own_ranks
