"""`@kernel`: typed parameters, compile-time specialization, and the trace into kernel IR."""
from __future__ import annotations

import hashlib
import inspect
import threading
from typing import Any, Callable

from . import ir
from .builder import TraceError, emit, emit_at_entry, tracing
from .transform import traceable
from .memory import load
from .values import Pointer, Scalar, as_scalar, declare_own_rank, is_own_rank

MAX_PEERS = 8
_TRACE_LOCK = threading.RLock()  # the trace state is global: one trace at a time (sim ranks are threads)


class constexpr:
    """Annotation of a compile-time parameter (a specialization: H, world, dtype, flags)."""


class _PtrAnnotation:
    def __init__(self, elem: Any, kind: str):
        self.elem = elem  # an ir type, or the name of a constexpr holding a dtype
        self.kind = kind  # "one", "by_value" or "in_memory"


class _PtrFactory:
    def __init__(self, kind: str):
        self.kind = kind

    def __getitem__(self, elem: Any) -> _PtrAnnotation:
        return _PtrAnnotation(elem, self.kind)


Ptr = _PtrFactory("one")
PeerPtrs = _PtrFactory("by_value")  # up to 8 peer pointers, passed as kernel arguments
# Peer pointers of a registered buffer, read at kernel entry from a table of MAX_PEERS
# addresses in device memory: the launch passes the table's address. The runtime can fill
# the table after a graph is captured, so replays read buffers registered after capture.
RegisteredPtrs = _PtrFactory("in_memory")


class _CallIdAnnotation:
    """`call: dsl.CallId`: an i32 the runtime fills for every launch with the call's tag (who
    is calling what: op, dtype, shape, path, world and the communicator's sequence number,
    hashed to 31 bits; see runtime/callid.py). The caller never passes it. Hand it to
    `dsl.Signal(sig, rank, W, call=call)` so peers can check that they run the same call."""

    role = "call_id"

    def __repr__(self) -> str:
        return "dsl.CallId"


CallId = _CallIdAnnotation()


def dtype_of(x: Any) -> ir.ScalarType:
    """An ir scalar type from an ir type, a name ('bf16') or a torch dtype."""
    if isinstance(x, (ir.ScalarType, ir.VectorType)):
        return x
    name = str(x).replace("torch.", "")
    aliases = {"bfloat16": "bf16", "float16": "f16", "half": "f16", "float32": "f32",
               "float": "f32", "int32": "i32", "int64": "i64", "int8": "i8", "uint8": "i8",
               "float8_e4m3fn": "i8", "float8_e4m3fnuz": "i8"}
    name = aliases.get(name, name)
    if name not in ir.SCALARS:
        raise TraceError(f"unsupported dtype {x!r}; expected one of {sorted(ir.SCALARS)}")
    return ir.SCALARS[name]


def _normalize_constexpr(v: Any) -> Any:
    """Dtype names and torch dtypes become ir types, so "bf16", torch.bfloat16 and ir.bf16
    specialize (and cache) the same way."""
    if isinstance(v, (ir.ScalarType, ir.VectorType)) or isinstance(v, (bool, int, float)):
        return v
    try:
        return dtype_of(v) if (isinstance(v, str) or "torch" in str(type(v))) else v
    except TraceError:
        return v


class PeerTable:
    """Peer pointers of one buffer; index with a rank (constant or traced).

    An entry is this rank's own memory only when indexed with the kernel's `rank` parameter
    (or a Signal's rank); any other index gives a `peer` pointer (possibly remote).
    """

    def __init__(self, ptrs: list[Pointer]):
        self.ptrs = ptrs

    def __len__(self) -> int:
        return len(self.ptrs)

    def __getitem__(self, rank: Any) -> Pointer:
        if isinstance(rank, int):
            if not 0 <= rank < len(self.ptrs):
                raise TraceError(f"peer index {rank} out of range [0, {len(self.ptrs)})")
            return Pointer(self.ptrs[rank].v, peer=True)
        rank = as_scalar(rank)
        t = self.ptrs[0].type
        return Pointer(emit("ptr_select", [rank.v] + [p.v for p in self.ptrs], [t]).result,
                       peer=not is_own_rank(rank))


class RegisteredTable(PeerTable):
    """Peer pointers loaded from a device-side table; each entry is loaded once, at kernel
    entry, on first use."""

    def __init__(self, table: Pointer, ptype: ir.PtrType):
        super().__init__([None] * MAX_PEERS)  # type: ignore[list-item]
        self.table, self.ptype = table, ptype

    def _entry(self, index: Any, peer: bool = True) -> Pointer:
        addr = load(self.table + index)
        return Pointer(emit("int_to_ptr", [addr.v], [self.ptype]).result, peer)

    def __getitem__(self, rank: Any) -> Pointer:
        if isinstance(rank, int):
            if not 0 <= rank < MAX_PEERS:
                raise TraceError(f"peer index {rank} out of range [0, {MAX_PEERS})")
            if self.ptrs[rank] is None:
                self.ptrs[rank] = emit_at_entry(lambda: self._entry(rank))
            return self.ptrs[rank]
        rank = as_scalar(rank)
        return self._entry(rank, peer=not is_own_rank(rank))


class Kernel:
    """A DSL kernel. `trace(**constexprs)` gives its IR; lowering and the simulator take that."""

    def __init__(self, fn: Callable, block_size: int | str, min_blocks: int | str | None = None):
        self.fn = fn
        self.name = fn.__name__
        self.block_size = block_size
        self.min_blocks = min_blocks
        self.signature = inspect.signature(fn, eval_str=True)  # resolves `from __future__ import annotations`
        self.constexpr_names = [n for n, p in self.signature.parameters.items()
                                if p.annotation is constexpr or p.annotation == "constexpr"]
        self._cache: dict[tuple, ir.Kernel] = {}

    def __repr__(self) -> str:
        return f"<peerdsl kernel {self.name}>"

    def __call__(self, *args, **kwargs):
        raise TraceError(f"kernel {self.name} cannot be called directly; trace it with "
                         ".trace(**constexprs) and launch it through a runtime backend")

    def _check_constexprs(self, constexprs: dict[str, Any]) -> None:
        missing = [n for n in self.constexpr_names if n not in constexprs
                   and self.signature.parameters[n].default is inspect.Parameter.empty]
        unknown = [n for n in constexprs if n not in self.constexpr_names]
        if missing or unknown:
            raise TraceError(f"kernel {self.name}: constexprs missing {missing}, unknown {unknown}"
                             f" (its constexprs are {self.constexpr_names})")

    def trace(self, **constexprs: Any) -> ir.Kernel:
        constexprs = {k: _normalize_constexpr(v) for k, v in constexprs.items()}
        self._check_constexprs(constexprs)
        for n in self.constexpr_names:
            if n not in constexprs:
                constexprs[n] = self.signature.parameters[n].default
        key = tuple(sorted((k, repr(v)) for k, v in constexprs.items()))
        with _TRACE_LOCK:
            if key not in self._cache:
                self._cache[key] = self._trace(constexprs)
            return self._cache[key]

    def _resolve_block_size(self, constexprs: dict[str, Any]) -> int:
        bs = self.block_size
        if isinstance(bs, str):
            bs = constexprs[bs]
        if not isinstance(bs, int) or bs < 32 or bs > 1024 or bs % 32:
            raise TraceError(f"kernel {self.name}: block size {bs!r} must be a multiple of 32 "
                             "in [32, 1024]")
        return bs

    def _resolve_min_blocks(self, constexprs: dict[str, Any], block_size: int) -> int | None:
        m = self.min_blocks
        if isinstance(m, str):
            m = constexprs[m]
        if m in (None, 0):
            return None
        if (not isinstance(m, int) or isinstance(m, bool) or not 1 <= m <= 32
                or m * block_size > 2048):
            raise TraceError(f"kernel {self.name}: min_blocks {m!r} must be an int in [1, 32] "
                             f"with min_blocks x block size ({block_size}) <= 2048 threads "
                             "per SM")
        return m

    def _trace(self, constexprs: dict[str, Any]) -> ir.Kernel:
        block_size = self._resolve_block_size(constexprs)
        min_blocks = self._resolve_min_blocks(constexprs, block_size)
        body = ir.Block()
        params: list[ir.Param] = []
        call_args: dict[str, Any] = {}
        for name, p in self.signature.parameters.items():
            ann = p.annotation
            if name in self.constexpr_names:
                call_args[name] = constexprs[name]
                continue
            if isinstance(ann, _PtrAnnotation):
                elem = ann.elem
                if isinstance(elem, str):
                    if elem not in constexprs:
                        raise TraceError(f"kernel {self.name}: parameter {name} is Ptr[{elem!r}] "
                                         f"but {elem!r} is not a constexpr of the kernel")
                    elem = constexprs[elem]
                ptype = ir.PtrType(dtype_of(elem), "global")
                if ann.kind == "in_memory":
                    v = ir.Value(ir.PtrType(ir.i64, "global"), body)
                    params.append(ir.Param(name, v.type, v))
                    call_args[name] = RegisteredTable(Pointer(v), ptype)
                    continue
                table = ann.kind == "by_value"
                ptrs = []
                for i in range(MAX_PEERS if table else 1):
                    v = ir.Value(ptype, body)
                    params.append(ir.Param(f"{name}_{i}" if table else name, ptype, v))
                    ptrs.append(Pointer(v))
                call_args[name] = PeerTable(ptrs) if table else ptrs[0]
            elif isinstance(ann, _CallIdAnnotation):
                v = ir.Value(ir.i32, body)
                params.append(ir.Param(name, ir.i32, v, role=ann.role))
                call_args[name] = Scalar(v)
            elif isinstance(ann, ir.ScalarType) and ann in (ir.i32, ir.i64, ir.f32):
                v = ir.Value(ann, body)
                params.append(ir.Param(name, ann, v))
                call_args[name] = Scalar(v)
            else:
                raise TraceError(f"kernel {self.name}: parameter {name!r} needs an annotation: "
                                 "Ptr[dtype], PeerPtrs[dtype], RegisteredPtrs[dtype], i32, i64, "
                                 "f32, dsl.CallId or constexpr")
        body.args = [p.value for p in params]
        with tracing(block_size, constexprs) as st:
            st.blocks.append(body)
            declare_own_rank(call_args.get("rank"))  # table[rank] is this rank's own memory
            traceable(self.fn)(**call_args)
            shared = st.shared
            if any(not sig.finished for sig in st.signals):
                raise TraceError(f"kernel {self.name} makes a Signal but never calls end() or "
                                 "finish(): its block epochs would not advance, and the next "
                                 "kernel's barriers would pass at once")
        return ir.Kernel(self.name, params, body, block_size, dict(constexprs), shared,
                         min_blocks)

    def instance_name(self, **constexprs: Any) -> str:
        """A symbol that names this specialization (the same on every target)."""
        constexprs = {k: _normalize_constexpr(v) for k, v in constexprs.items()}
        self._check_constexprs(constexprs)
        text = repr(sorted((k, str(v)) for k, v in constexprs.items()))
        return f"{self.name}_{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def kernel(fn: Callable | None = None, *, block_size: int | str = 256,
           min_blocks: int | str | None = None):
    """Decorate a kernel function. `block_size` is an int or the name of a constexpr param.
    `min_blocks` (an int, a constexpr's name, or None/0 for the target's default) is how many
    blocks per multiprocessor the kernel must fit: on NVIDIA the register cap becomes
    64K / (min_blocks x block_size) (the default leaves 128 per thread); AMD targets size
    their waves from the VGPRs the kernel needs and ignore it."""
    if fn is None:
        return lambda f: Kernel(f, block_size, min_blocks)
    return Kernel(fn, block_size, min_blocks)
