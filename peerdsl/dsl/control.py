"""Runtime of traced control flow. `transform.py` rewrites Python `if`/`for`/`while` into calls
here: a Python condition or constant range runs as plain Python (so constexpr branches and
rank loops unroll), a traced one becomes a structured IR op whose results are the variables
the body assigns.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from . import ir
from .builder import TraceError, emit, in_block, user_location
from .values import Scalar, Traced, as_scalar, wrap


class Undef:
    """A variable that is not bound on every path through a traced construct."""
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def _fail(self, *_a, **_k):
        raise TraceError(f"{user_location()}: variable {self.name!r} is not defined on every "
                         "path through a traced if/for/while; define it before the construct")

    __bool__ = __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _fail
    __getattr__ = __getitem__ = __call__ = __lt__ = __gt__ = __le__ = __ge__ = _fail
    __truediv__ = __floordiv__ = __and__ = __or__ = __neg__ = __index__ = __iter__ = _fail


def init(frame_locals: dict, names: Sequence[str]) -> tuple:
    return tuple(frame_locals.get(n, Undef(n)) for n in names)


# ----------------------------------------------------------------------------- pytrees

def _flatten(x: Any, leaves: list) -> Any:
    """Structure of x with traced/number leaves replaced by their index in `leaves`."""
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_flatten(e, leaves) for e in x))
    if isinstance(x, (Traced, int, float)) and not isinstance(x, bool):
        leaves.append(x)
        return ("leaf", len(leaves) - 1)
    return ("static", x)


def _unflatten(spec: Any, leaves: Sequence[Any]) -> Any:
    kind, payload = spec
    if kind == "leaf":
        return leaves[payload]
    if kind == "static":
        return payload
    return kind(_unflatten(s, leaves) for s in payload)


def _same_structure(a: Any, b: Any, name: str) -> None:
    def shape(s):
        kind, payload = s
        if kind == "leaf":
            return "leaf"
        if kind == "static":
            return ("static", id(payload) if not isinstance(payload, (str, type(None))) else payload)
        return (kind, tuple(shape(p) for p in payload))
    if shape(a) != shape(b):
        raise TraceError(f"{user_location()}: variable {name!r} changes structure inside a traced "
                         "if/for/while (a list length or a non-traced value differs between paths)")


def _leaf_type(x: Any, like: Any = None) -> Any:
    if isinstance(x, Traced):
        return x.type
    if isinstance(like, ir.ScalarType):
        return like
    return ir.f32 if isinstance(x, float) else ir.i32


def _materialize(x: Any, t: Any, name: str) -> ir.Value:
    if isinstance(x, Traced):
        if x.type != t:
            raise TraceError(f"{user_location()}: variable {name!r} is {x.type} on one path and "
                             f"{t} on another; give it one type before the construct")
        return x.v
    return as_scalar(x, t).v


# ----------------------------------------------------------------------------- if

def if_(cond: Any, then_fn: Callable, else_fn: Callable, names: Sequence[str],
        inits: tuple) -> tuple:
    if not isinstance(cond, Traced):
        return then_fn(*inits) if cond else else_fn(*inits)
    cond = _as_bool(cond)
    then_block, else_block = ir.Block(), ir.Block()
    with in_block(then_block):
        t_out = then_fn(*inits)
    with in_block(else_block):
        e_out = else_fn(*inits)
    results: list[Any] = [None] * len(names)
    carried: list[tuple[int, Any, Any, Any, list, list]] = []
    for i, name in enumerate(names):
        t, e = t_out[i], e_out[i]
        if t is e:
            results[i] = t
            continue
        if isinstance(t, Undef) or isinstance(e, Undef):
            results[i] = Undef(name)
            continue
        t_leaves: list = []
        e_leaves: list = []
        t_spec, e_spec = _flatten(t, t_leaves), _flatten(e, e_leaves)
        _same_structure(t_spec, e_spec, name)
        carried.append((i, name, t_spec, None, t_leaves, e_leaves))
    types: list[Any] = []
    t_vals: list[ir.Value] = []
    e_vals: list[ir.Value] = []
    for _i, name, _spec, _, t_leaves, e_leaves in carried:
        for a, b in zip(t_leaves, e_leaves):
            t = _leaf_type(a) if isinstance(a, Traced) else _leaf_type(b, _leaf_type(a))
            types.append(t)
            with in_block(then_block):
                t_vals.append(_materialize(a, t, name))
            with in_block(else_block):
                e_vals.append(_materialize(b, t, name))
    with in_block(then_block):
        emit("yield", t_vals, [])
    with in_block(else_block):
        emit("yield", e_vals, [])
    op = emit("if", [cond.v], types)
    op.regions = [then_block, else_block]
    out = [wrap(r) for r in op.results]
    k = 0
    for i, _name, spec, _, t_leaves, _e in carried:
        results[i] = _unflatten(spec, out[k:k + len(t_leaves)])
        k += len(t_leaves)
    return tuple(results)


def _as_bool(c: Traced) -> Scalar:
    if not isinstance(c, Scalar) or c.type.is_float:
        raise TraceError(f"{user_location()}: condition must be an integer or i1, got {c.type}")
    return c if c.type is ir.i1 else c != 0


# ----------------------------------------------------------------------------- loops

def _carry(names: Sequence[str], inits: tuple):
    """Split loop state into carried leaves (traced or numbers) and pass-through values."""
    specs, leaves, owner = [], [], []
    for name, v in zip(names, inits):
        if isinstance(v, Undef):
            specs.append(None)
            continue
        start = len(leaves)
        specs.append(_flatten(v, leaves))
        owner.extend([name] * (len(leaves) - start))
    return specs, leaves, owner


def _rebuild(names, inits, specs, values):
    return [Undef(name) if spec is None else _unflatten(spec, values)
            for name, spec in zip(names, specs)]


def _trace_body(block: ir.Block, fn: Callable, args: list, names, inits, specs, leaf_types,
                owner, terminator: str = "yield", extra: list | None = None) -> None:
    with in_block(block):
        state = _rebuild(names, inits, specs, [wrap(a) for a in args])
        out = fn(*state)
        leaves: list = []
        for name, spec, v in zip(names, specs, out):
            if spec is None:
                continue
            _same_structure(spec, _flatten(v, leaves_probe := []), name)
            leaves.extend(leaves_probe)
        vals = [_materialize(x, t, n) for x, t, n in zip(leaves, leaf_types, owner)]
        emit(terminator, (extra or []) + vals, [])


def for_(range_args: tuple, body_fn: Callable, names: Sequence[str], inits: tuple) -> tuple:
    if not any(isinstance(a, Traced) for a in range_args):
        state = tuple(inits)
        for i in range(*range_args):
            state = body_fn(i, *state)
        return state
    if len(range_args) == 1:
        range_args = (0, range_args[0], 1)
    elif len(range_args) == 2:
        range_args = (range_args[0], range_args[1], 1)
    itype = ir.i64 if any(isinstance(a, Traced) and a.type is ir.i64 for a in range_args) else ir.i32
    lb, ub, step = (as_scalar(a, itype) for a in range_args)
    if not (lb.type == ub.type == step.type == itype):
        raise TraceError(f"{user_location()}: range bounds must all be i32 or all i64")
    if isinstance(range_args[2], int) and range_args[2] <= 0:
        raise TraceError(f"{user_location()}: traced range needs a positive step")
    specs, leaves, owner = _carry(names, inits)
    leaf_types = [_leaf_type(x) for x in leaves]
    init_vals = [_materialize(x, t, n) for x, t, n in zip(leaves, leaf_types, owner)]
    body = ir.Block()
    iv = ir.Value(itype, body)
    body.args = [iv] + [ir.Value(t, body) for t in leaf_types]

    def fn_with_iv(*state):
        return body_fn(wrap(iv), *state)

    _trace_body(body, fn_with_iv, body.args[1:], names, inits, specs, leaf_types, owner)
    op = emit("for", [lb.v, ub.v, step.v] + init_vals, leaf_types)
    op.regions = [body]
    return tuple(_rebuild(names, inits, specs, [wrap(r) for r in op.results]))


def while_(cond_fn: Callable, body_fn: Callable, names: Sequence[str], inits: tuple) -> tuple:
    with in_block(ir.Block()):  # probe: is the condition traced? (ops discarded)
        probe = cond_fn(*inits)
    if not isinstance(probe, Traced):
        state = tuple(inits)
        while cond_fn(*state):
            state = body_fn(*state)
        return state
    specs, leaves, owner = _carry(names, inits)
    leaf_types = [_leaf_type(x) for x in leaves]
    init_vals = [_materialize(x, t, n) for x, t, n in zip(leaves, leaf_types, owner)]
    before, after = ir.Block(), ir.Block()
    before.args = [ir.Value(t, before) for t in leaf_types]
    after.args = [ir.Value(t, after) for t in leaf_types]
    with in_block(before):
        state = _rebuild(names, inits, specs, [wrap(a) for a in before.args])
        c = cond_fn(*state)
        if not isinstance(c, Traced):
            c = as_scalar(bool(c))
        c = _as_bool(c)
        emit("condition", [c.v] + list(before.args), [])
    _trace_body(after, body_fn, after.args, names, inits, specs, leaf_types, owner)
    op = emit("while", init_vals, leaf_types)
    op.regions = [before, after]
    return tuple(_rebuild(names, inits, specs, [wrap(r) for r in op.results]))


# ----------------------------------------------------------------------------- expressions

def and_(a: Any, b_fn: Callable[[], Any]) -> Any:
    if not isinstance(a, Traced):
        return a and b_fn()
    b = b_fn()
    if not isinstance(b, Traced):
        return _as_bool(a) if b else as_scalar(False)
    return _as_bool(a) & _as_bool(b)


def or_(a: Any, b_fn: Callable[[], Any]) -> Any:
    if not isinstance(a, Traced):
        return a or b_fn()
    b = b_fn()
    if not isinstance(b, Traced):
        return as_scalar(True) if b else _as_bool(a)
    return _as_bool(a) | _as_bool(b)


def not_(a: Any) -> Any:
    if not isinstance(a, Traced):
        return not a
    return _as_bool(a) ^ True


def select(cond: Any, a_fn: Callable[[], Any], b_fn: Callable[[], Any]) -> Any:
    if not isinstance(cond, Traced):
        return a_fn() if cond else b_fn()
    cond = _as_bool(cond)
    a, b = a_fn(), b_fn()
    if isinstance(a, Traced) or not isinstance(b, Traced):
        t = _leaf_type(a, _leaf_type(b) if isinstance(b, Traced) else None)
    else:
        t = b.type
    av, bv = _materialize(a, t, "<ternary>"), _materialize(b, t, "<ternary>")
    return wrap(emit("select", [cond.v, av, bv], [t]).result)
