"""`peerdsl compare --run`: the recipe API, and the pure half of running both kernels.

A recipe is a function `recipe(ctx: RunContext) -> RunCase`, named on the command line as
`--inputs MODULE:FUNCTION` (MODULE a dotted name or a .py file). It makes the inputs once and
says how each side takes them: the DSL op's arguments by name (as `comm.launch` takes them),
the reference's parameters in order, the grid, and which buffers must come out byte-equal.
The shipped ops' recipes are ordinary recipes in peerdsl/compare_recipes.py.

Both sides' arguments are packed by one implementation, runtime/packplan.py (PackPlan): the
DSL's layout is its manifest entry's; the reference's is the layout its cubin records
(offset, size per parameter), given argument types here from the recipe's values.

Everything in this module is pure (CPU-testable); compare_gpu.py loads, launches and times.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Sequence

from . import layout
from .runtime.kernarg import ArgSpec, parse_type, peer_tables
from .runtime.manifest import KernelEntry

SPIN_LIMIT = 1 << 20  # iterations of a bounded spin before a kernel records an error


class CompareError(Exception):
    """Bad input to `peerdsl compare` (the message says what to change)."""


# ----------------------------------------------------------------------------- recipe API
@dataclasses.dataclass(frozen=True)
class Typed:
    """A reference parameter value with its type spelled out (`i64(5)`, `f32(x)`), for when
    the value alone would be read otherwise (an int is an i32 in a 4-byte slot)."""
    type: str   # i8 i16 i32 i64 f32 f64 ptr
    value: Any


def i32(v: int) -> Typed: return Typed("i32", v)
def i64(v: int) -> Typed: return Typed("i64", v)
def f32(v: float) -> Typed: return Typed("f32", v)
def f64(v: float) -> Typed: return Typed("f64", v)
def ptr(v: Any) -> Typed: return Typed("ptr", v)


@dataclasses.dataclass
class Output:
    """A buffer both kernels write: per rank, the DSL's tensor and the reference's."""
    name: str
    dsl: list[Any]
    ref: list[Any]


@dataclasses.dataclass
class Check:
    """An exact expectation besides DSL == reference (e.g. a torch recomputation)."""
    label: str
    actual: Any
    expected: Any


@dataclasses.dataclass
class RunCase:
    """What a recipe returns.

    dsl_args: per rank, the DSL kernel's arguments by name: tensors, int addresses, None,
        numbers, and for a PeerPtrs parameter a list of per-rank addresses/tensors.
    ref_args: per rank, the reference kernel's parameters in declaration order: a tensor,
        None or `ptr(addr)` for a pointer; a list for a struct of pointers (`Peers<T>`,
        padded with its first entry); an int fills an integer slot of its size (a pointer
        slot of 8 bytes too); a float an f32/f64 slot; `i32()`, `f32()` ... force a type.
    outputs: what must come out byte-equal, rank by rank.
    grid: blocks per rank (both sides). Kernels that wait on each other need every block of
        every rank resident at once: stay at or below `ctx.max_grid`.
    """
    dsl_args: list[dict[str, Any]]
    ref_args: list[list[Any]]
    outputs: list[Output]
    grid: int
    ref_block: int | None = None   # threads per reference block; default the DSL's
    checks: list[Check] = dataclasses.field(default_factory=list)
    signals: dict[str, list[Any]] = dataclasses.field(default_factory=dict)  # side -> Signals
    description: str = ""


@dataclasses.dataclass
class RunContext:
    """What a recipe gets: torch, where to allocate, the shape, and helpers."""
    torch: Any
    device: str                       # "cuda" on the GPU ("cpu" when tests run a recipe)
    world: int                        # ranks, one CUDA stream each, on one GPU
    constexprs: dict[str, Any]        # the DSL variant's, JSON form (T="bf16", H=6144)
    block: int                        # the DSL kernel's threads per block
    max_grid: int                     # blocks per rank that keep every rank's blocks resident
    options: dict[str, str] = dataclasses.field(default_factory=dict)  # --recipe-arg K=V
    seed: int = 1234
    generator: Any = None

    def __post_init__(self) -> None:
        if self.generator is None:
            self.generator = self.torch.Generator(device=self.device).manual_seed(self.seed)

    def option(self, name: str, default: Any, kind: Callable[[str], Any] = int) -> Any:
        """--recipe-arg NAME=V converted by `kind`, else `default`."""
        if name not in self.options:
            return default
        try:
            return kind(self.options[name])
        except ValueError:
            raise CompareError(f"--recipe-arg {name}={self.options[name]!r}: expected "
                               f"{getattr(kind, '__name__', kind)}") from None

    def randn(self, *shape: int, dtype: Any = None) -> Any:
        t = self.torch
        x = t.randn(*shape, generator=self.generator, device=self.device)
        return x.to(dtype or t.bfloat16)

    def signals(self) -> list[Any]:
        """One zeroed Signal buffer per rank, with the host's spin limit set (each side
        needs its own: their epochs must not mix)."""
        out = []
        for _ in range(self.world):
            s = self.torch.zeros(layout.SIGNAL_BYTES // 4, dtype=self.torch.int32,
                                 device=self.device)
            s[layout.SIG_SPIN_LIMIT] = SPIN_LIMIT
            out.append(s)
        return out

    def device_table(self, items: Sequence[Any]) -> Any:
        """A RegisteredPtrs table: every rank's address in device memory (int64 row)."""
        addrs = [int(x.data_ptr()) if hasattr(x, "data_ptr") else int(x) for x in items]
        return self.torch.tensor(layout.peer_row(addrs), dtype=self.torch.int64,
                                 device=self.device)


def recipe(constexprs: dict[str, Any] | None = None) -> Callable[[Callable], Callable]:
    """Mark a recipe; `constexprs` are the defaults `peerdsl compare` uses for the op's
    variant when --constexpr does not say (static table and --run alike)."""
    def mark(fn: Callable) -> Callable:
        fn.peerdsl_recipe = True
        fn.constexprs = dict(constexprs or {})
        return fn
    return mark


# ----------------------------------------------------------------------------- loading
def import_module_spec(spec: str) -> ModuleType:
    """A dotted module name, or a .py file (imported once under a name of its path)."""
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        path = path.resolve()
        if not path.is_file():
            raise CompareError(f"module file {spec} does not exist")
        name = f"peerdsl_user_{path.stem}_{hashlib.sha256(str(path).encode()).hexdigest()[:8]}"
        if name in sys.modules:
            return sys.modules[name]
        s = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(s)
        sys.modules[name] = mod
        try:
            s.loader.exec_module(mod)
        except Exception as e:
            del sys.modules[name]
            raise CompareError(f"importing {spec} failed{_where(e, str(path))}: "
                               f"{type(e).__name__}: {e}") from e
        return mod
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        raise CompareError(f"cannot import module {spec!r}: {e} (a file path must end in .py)")
    except Exception as e:
        raise CompareError(f"importing {spec} failed{_where(e)}: {type(e).__name__}: {e}") from e


def _where(e: BaseException, path: str | None = None) -> str:
    """' at FILE:LINE' of the innermost frame in the user's file (else the innermost one
    outside peerdsl), so an error in a user module names the user's line."""
    import traceback
    frames = traceback.extract_tb(e.__traceback__)
    pkg = str(Path(__file__).resolve().parent)
    mine = [f for f in frames if (f.filename == path if path else not f.filename.startswith(
        pkg) and not f.filename.startswith("<frozen"))]
    return f" at {mine[-1].filename}:{mine[-1].lineno}" if mine else ""


def load_recipe(spec: str) -> Callable[[RunContext], RunCase]:
    """`MODULE:FUNCTION` -> the function."""
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise CompareError(f"--inputs {spec!r}: expected MODULE:FUNCTION (MODULE a dotted "
                           "name or a .py file), e.g. peerdsl.compare_recipes:allreduce_ll")
    fn = getattr(import_module_spec(mod_name), fn_name, None)
    if not callable(fn):
        raise CompareError(f"--inputs {spec!r}: {mod_name} has no function {fn_name!r}")
    return fn


def default_recipe(op: str) -> Callable[[RunContext], RunCase] | None:
    """The shipped recipe of `op` (a function of that name in compare_recipes), if any."""
    from . import compare_recipes
    fn = getattr(compare_recipes, op, None)
    return fn if getattr(fn, "peerdsl_recipe", False) else None


# ----------------------------------------------------------------------------- packing
def check_dsl_args(entry: KernelEntry, values: dict[str, Any], rank: int) -> None:
    """Every argument present, none unknown (peer tables by their base name or members)."""
    tables = peer_tables(entry.args)
    members = {m for ms in tables.values() for m in ms}
    want = [n for n in [*tables, *(a.name for a in entry.args if a.name not in members)]]
    missing = [n for n in want if n not in values
               and not (n in tables and all(m in values for m in tables[n]))]
    unknown = sorted(set(values) - set(want) - members)
    if missing or unknown:
        raise CompareError(f"recipe: rank {rank} DSL arguments for {entry.name}: missing "
                           f"{missing}, unknown {unknown} (the kernel takes {want})")


# The tag every rank's DSL kernel gets for its dsl.CallId parameters: peers compare tags, so
# any value works as long as all ranks pass the same one (a recipe never passes it).
COMPARE_CALL_TAG = 1


def pack_dsl(entry: KernelEntry, values: dict[str, Any], rank: int = 0) -> bytes:
    calls = [a.name for a in entry.args if a.role == "call_id" and a.name not in values]
    if calls:
        values = {**values, **{name: COMPARE_CALL_TAG for name in calls}}
    check_dsl_args(entry, values, rank)
    return entry.pack_plan().pack(values)


def _is_pointer_like(v: Any) -> bool:
    return v is None or hasattr(v, "data_ptr")


def _param_spec(i: int, offset: int, size: int, v: Any) -> list[ArgSpec]:
    """The ArgSpecs of reference parameter #i (a struct of k pointers is k of them)."""
    name = f"p{i}"
    if isinstance(v, Typed):
        t = parse_type(v.type)
        if t.size != size:
            raise CompareError(f"reference parameter #{i} is {size} bytes in the code object; "
                               f"the recipe gives it as {v.type} ({t.size} bytes)")
        return [ArgSpec(name, t, offset, size)]
    if isinstance(v, (list, tuple)):
        if size % 8 or not 1 <= len(v) <= size // 8:
            raise CompareError(f"reference parameter #{i} is {size} bytes; a list fills a "
                               f"struct of pointers (8 bytes each), got {len(v)} entries")
        if size == 8:
            return [ArgSpec(name, parse_type("ptr"), offset, 8)]
        return [ArgSpec(f"{name}_{j}", parse_type("ptr"), offset + 8 * j, 8)
                for j in range(size // 8)]
    kinds = {8: "ptr", 4: "i32", 2: "i16", 1: "i8"} if not isinstance(v, float) else {
        8: "f64", 4: "f32"}
    if isinstance(v, bool) or size not in kinds or (_is_pointer_like(v) and size != 8):
        raise CompareError(f"reference parameter #{i}: {type(v).__name__} value for a "
                           f"{size}-byte slot (use a list for a struct of pointers, or "
                           "i32()/i64()/f32()/ptr() to say the type)")
    kind = "i64" if kinds[size] == "ptr" and isinstance(v, int) and v < 0 else kinds[size]
    return [ArgSpec(name, parse_type(kind), offset, size)]


def ref_entry(symbol: str, code_object: Path, sha256: str, params: Sequence[tuple[int, int]],
              sample: Sequence[Any], kernarg_size: int, block: int) -> KernelEntry:
    """A KernelEntry for a foreign kernel: its cubin's parameter layout [(offset, size)],
    typed from one rank's values, so PackPlan packs it as it packs the DSL's."""
    if len(sample) != len(params):
        raise CompareError(f"reference {symbol} takes {len(params)} parameters (offset, size: "
                           f"{list(params)}); the recipe gives {len(sample)}")
    specs = tuple(s for i, ((off, size), v) in enumerate(zip(params, sample))
                  for s in _param_spec(i, off, size, v))
    size = max(kernarg_size, max((o + s for o, s in params), default=0))
    return KernelEntry(
        name=f"reference:{symbol}", op="reference", symbol=symbol, path=Path(code_object),
        sha256=sha256, constexprs={}, block_size=int(block), lds_bytes=0, dynamic_lds_bytes=0,
        args=specs, kernarg_size=size, resources={}, cache_key="", raw={})


def ref_values(entry: KernelEntry, values: Sequence[Any]) -> dict[str, Any]:
    """Positional reference values as PackPlan's name -> value (p3=[...] for a table)."""
    out: dict[str, Any] = {}
    names = {a.name for a in entry.args}
    for i, v in enumerate(values):
        v = v.value if isinstance(v, Typed) else v
        if isinstance(v, (list, tuple)) and f"p{i}" in names:
            v = v[0]  # a one-pointer "struct"
        out[f"p{i}"] = list(v) if isinstance(v, (list, tuple)) else v
    return out


def pack_ref(entry: KernelEntry, values: Sequence[Any]) -> bytes:
    return entry.pack_plan().pack(ref_values(entry, values))


# ----------------------------------------------------------------------------- report
@dataclasses.dataclass
class RunReport:
    device: str
    description: str
    world: int
    grid: int
    blocks: tuple[int, int]                  # threads per block: DSL, reference
    results: list[tuple[str, bool]]          # (what, byte-equal)
    errors: list[str]                        # spin expiries read back from the Signals
    latency_us: tuple[float, float] | None   # DSL, reference
    timing: str = ""

    @property
    def ok(self) -> bool:
        return bool(self.results) and all(ok for _, ok in self.results) and not self.errors


def format_report(r: RunReport) -> str:
    lines = [f"--run on {r.device}: W={r.world} ranks as streams, grid={r.grid} per rank, "
             f"block DSL {r.blocks[0]} / reference {r.blocks[1]}"
             + (f"; {r.description}" if r.description else "")]
    lines += [f"  {'OK  ' if ok else 'DIFF'} {what}" for what, ok in r.results]
    lines += [f"  ERROR {e}" for e in r.errors]
    if r.latency_us is not None:
        d, ref = r.latency_us
        ratio = f"{d / ref:.2f}" if ref > 0 else "-"
        lines.append(f"  latency per call ({r.timing}): DSL {d:.1f} us, reference {ref:.1f} "
                     f"us, DSL/ref {ratio}")
    equal = sum(ok for _, ok in r.results)
    lines.append(f"  {'PASS' if r.ok else 'FAIL'}: {equal}/{len(r.results)} byte-equal, "
                 f"{len(r.errors)} spin errors")
    return "\n".join(lines)


def signal_errors(signals: Sequence[Any], who: str) -> list[str]:
    """The first spin expiry each rank's Signal recorded (rank, block, wait, expected, seen)."""
    out = []
    for r, s in enumerate(signals):
        e = [int(x) for x in s[layout.SIG_ERROR:layout.SIG_ERROR + 6].tolist()]
        if e[0]:
            out.append(f"{who} rank {r}: spin expired: rank {e[1]} block {e[2]} "
                       f"{layout.WAIT_NAMES.get(e[3], e[3])} expected {e[4]} saw {e[5]}")
    return out


def same_bytes(a: Any, b: Any) -> bool:
    """Bitwise equality of two tensors of any dtype (NaN payloads included)."""
    import torch
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
