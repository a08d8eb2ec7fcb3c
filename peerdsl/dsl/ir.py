"""The kernel IR: the single trace that both `lowering/` (MLIR) and the simulator consume.

An IR kernel is a tree of `Op`s in `Block`s. Structured control flow (`if`, `for`, `while`)
holds nested blocks; values are SSA. The printed form is stable and is what the build cache
hashes, so any change to a kernel or a helper it calls changes the key.

Op catalogue (name: operands -> results; attrs):
  const: -> r; value
  add sub mul div rem min max and or xor shl shr: a, b -> r      (div/rem on ints are signed)
  fmaximum: a, b -> r                     (f32 only: IEEE 754-2019 maximum, NaN propagates)
  fma: a, b, c -> r
  neg abs rsqrt rcp sqrt not: a -> r
  cmp: a, b -> i1; pred in lt le gt ge eq ne, wlt wge
        (wlt/wge: wrap-safe compare of integer counters, by the sign of the wrapping
        difference: a wge b iff (a - b) mod 2^n < 2^(n-1); what epochs use)
  select: c, a, b -> r
  cast: a -> r; kind in sext zext trunc sitofp fptosi extf truncf bitcast
        (truncf is round-to-nearest-even; bitcast also between vectors of equal size)
  vec_extract: v -> scalar; index          vec_build: s0..sn-1 -> vec
  special: -> i32; which in thread_id block_id grid_dim
  shfl_xor: v, -> v; mask, width         (butterfly inside groups of `width` lanes)
  ptr_offset: p, idx -> p2                (idx counts elements of p's element type)
  ptr_cast: p -> p2                       (same address, new element type)
  ptr_select: idx, p0..pn-1 -> p          (dynamic index into a peer-pointer table)
  int_to_ptr: i64 -> p                    (an address read from memory, e.g. a peer table)
  load: p -> v; scope, order, nontemporal
  store: p, v; scope, order, nontemporal
  atomic: p, v -> old; kind in add max umax xchg, scope, order
  cas: p, expected, desired -> old; scope, order
  fence: ; scope, order
  barrier: ; memory in all shared         (block-wide execution + workgroup memory barrier;
                                          memory=shared orders shared memory only; absent: all)
  smem: -> ptr<shared>; name, count      (static shared allocation, kernel scope)
  globaltimer: -> i64                     (nanoseconds)
  schedule_fence: ;                       (the compiler may not move code across it; no effect
                                          on values or memory; a target may drop it)
  if: c -> results; regions then, else (each ends with yield)
  for: lb, ub, step, inits.. -> results; region body(iv, iters..) ends with yield
  while: inits.. -> results; regions before(args..) ends with condition(c, vals..),
         after(args..) ends with yield
  yield / condition: terminators

Semantics (the simulator and every target agree bit for bit):
  integers are two's complement; div, rem, cmp, max, min are signed; shr is logical; sext of
  i1 is not used (i1 -> int is zext). Floats are IEEE binary32/16/bfloat16 with
  round-to-nearest-even for add sub mul div fma sqrt and for truncf/sitofp; no contraction of
  mul+add into fma; fptosi truncates toward zero. rsqrt(x) = div(1, sqrt(x)) with two
  roundings; rcp(x) = div(1, x). max/min on floats are IEEE maxNum/minNum (a NaN operand
  loses); fmaximum returns NaN when either operand is NaN (which NaN is unspecified: a kernel
  must not store its payload as a result) and orders -0 below +0. vec_extract/vec_build index lanes of a vector in memory order.
  Memory: scope None = plain access; scoped scalar access = atomic with the order; scoped
  vector access = one 16-byte access (relaxed) at that scope, volatile inside a `while`
  (a poll re-reads memory every iteration).
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Iterator

SCOPES = ("wave", "workgroup", "agent", "system")
ORDERS = ("relaxed", "acquire", "release", "acq_rel")
MEMORY_SPACES = ("global", "shared")


@dataclasses.dataclass(frozen=True)
class ScalarType:
    name: str  # i1 i8 i32 i64 f16 bf16 f32
    bits: int

    @property
    def is_float(self) -> bool:
        return self.name in ("f16", "bf16", "f32")

    @property
    def is_int(self) -> bool:
        return not self.is_float

    @property
    def nbytes(self) -> int:
        return max(1, self.bits // 8)

    def __str__(self) -> str:
        return self.name


@dataclasses.dataclass(frozen=True)
class VectorType:
    elem: ScalarType
    count: int

    @property
    def nbytes(self) -> int:
        return self.elem.nbytes * self.count

    def __str__(self) -> str:
        return f"{self.elem}x{self.count}"


@dataclasses.dataclass(frozen=True)
class PtrType:
    elem: "ScalarType | VectorType"
    space: str = "global"

    nbytes = 8

    def __str__(self) -> str:
        return f"ptr<{self.elem},{self.space}>"


Type = "ScalarType | VectorType | PtrType"

i1 = ScalarType("i1", 1)
i8 = ScalarType("i8", 8)
i32 = ScalarType("i32", 32)
i64 = ScalarType("i64", 64)
f16 = ScalarType("f16", 16)
bf16 = ScalarType("bf16", 16)
f32 = ScalarType("f32", 32)
SCALARS = {t.name: t for t in (i1, i8, i32, i64, f16, bf16, f32)}

_ids = itertools.count()


class Value:
    """An SSA value. The DSL wraps it (dsl.values) to give it operators."""

    __slots__ = ("type", "id", "owner")

    def __init__(self, type_: Any, owner: "Op | Block | None" = None):
        self.type = type_
        self.id = next(_ids)
        self.owner = owner


@dataclasses.dataclass
class Block:
    args: list[Value] = dataclasses.field(default_factory=list)
    ops: list["Op"] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Op:
    name: str
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = dataclasses.field(default_factory=dict)
    regions: list[Block] = dataclasses.field(default_factory=list)
    loc: str = ""  # "file:line" of the user source that produced the op

    @property
    def result(self) -> Value:
        return self.results[0]


@dataclasses.dataclass
class Param:
    name: str
    type: Any  # ScalarType or PtrType
    value: Value
    role: str = ""  # "call_id": filled by the runtime (dsl.CallId), never by the caller


@dataclasses.dataclass
class Kernel:
    name: str
    params: list[Param]
    body: Block
    block_size: int
    constexprs: dict[str, Any]
    shared: list[Op]  # smem ops, hoisted to kernel scope
    min_blocks: int | None = None  # blocks per multiprocessor it must fit (dsl.kernel)

    def walk(self) -> Iterator[Op]:
        yield from self.shared
        yield from walk_block(self.body)

    def shared_bytes(self) -> int:
        total = 0
        for op in self.shared:
            elem = op.result.type.elem
            total = _align(total, 16) + elem.nbytes * op.attrs["count"]
        return total


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def walk_block(block: Block) -> Iterator[Op]:
    for op in block.ops:
        yield op
        for region in op.regions:
            yield from walk_block(region)


# ----------------------------------------------------------------------------- printing

def print_kernel(kernel: Kernel, with_locs: bool = False) -> str:
    """Stable text form. Value numbering is local, so identical kernels print identically."""
    names: dict[int, str] = {}

    def name(v: Value) -> str:
        if v.id not in names:
            names[v.id] = f"%{len(names)}"
        return names[v.id]

    lines = []
    params = ", ".join(f"{name(p.value)}: {p.type} {p.name}" + (f" [{p.role}]" if p.role else "")
                       for p in kernel.params)
    consts = ", ".join(f"{k}={v!r}" for k, v in sorted(kernel.constexprs.items()))
    fit = f" min_blocks={kernel.min_blocks}" if kernel.min_blocks else ""
    lines.append(f"kernel {kernel.name}({params}) block={kernel.block_size}{fit} [{consts}] {{")
    for op in kernel.shared:
        lines.append("  " + _print_op(op, name, 1, with_locs))
    _print_block(kernel.body, name, 1, lines, with_locs)
    lines.append("}")
    return "\n".join(lines)


def _print_block(block: Block, name, depth: int, lines: list[str], with_locs: bool) -> None:
    for op in block.ops:
        lines.append("  " * depth + _print_op(op, name, depth, with_locs))
        for i, region in enumerate(op.regions):
            args = ", ".join(f"{name(a)}: {a.type}" for a in region.args)
            lines.append("  " * (depth + 1) + f"^{i}({args}):")
            _print_block(region, name, depth + 2, lines, with_locs)


def _print_op(op: Op, name, depth: int, with_locs: bool) -> str:
    res = ", ".join(f"{name(r)}: {r.type}" for r in op.results)
    ops = ", ".join(name(o) for o in op.operands)
    attrs = ", ".join(f"{k}={v!r}" for k, v in sorted(op.attrs.items()))
    text = f"{res + ' = ' if res else ''}{op.name}({ops})"
    if attrs:
        text += " {" + attrs + "}"
    if with_locs and op.loc:
        text += f"  @ {op.loc}"
    return text
