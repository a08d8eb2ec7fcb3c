"""Source rewrite that lets kernels use Python `if`, `for ... in range(...)`, `while`, `and`,
`or`, `not` and `x if c else y` on traced values.

Each such statement becomes a call into `control.py` with its body as a nested function that
takes and returns the variables the body assigns. A statement whose body contains `return`,
`break` or `continue` is left as plain Python: its condition must then be a Python value
(a constexpr), and a traced one fails with the source line. Calls go through `call()` so plain
Python helpers called from a kernel are rewritten the same way, on first use.
"""
from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
from typing import Any, Callable

from . import control
from .builder import TraceError

_RT = "__pd"
_SKIP_ROOTS = set(sys.stdlib_module_names) | {"torch", "numpy", "builtins"}
_DSL_INTERNAL = {f"peerdsl.dsl.{m}" for m in
                 ("ir", "builder", "values", "memory", "control", "transform", "kernel")}


def _assigned_names(stmts: list[ast.stmt]) -> list[str]:
    names: dict[str, None] = {}

    class Visitor(ast.NodeVisitor):
        def visit_Name(self, node: ast.Name) -> None:
            if isinstance(node.ctx, ast.Store) and not node.id.startswith(_RT):
                names[node.id] = None

        def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
            if not node.name.startswith(_RT):
                names[node.name] = None
            # names assigned inside a nested def are its own

        def visit_Lambda(self, node: ast.Lambda) -> None:
            pass

    for s in stmts:
        Visitor().visit(s)
    return list(names)


def _has_escape(stmts: list[ast.stmt], loop: bool) -> bool:
    """True if the statements contain return, or break/continue that leaves this construct."""
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # a return inside a nested def (our own bodies too) stays there
        for sub in _walk_same_function(node, inside_loop=False):
            kind, nested_loop = sub
            if isinstance(kind, ast.Return):
                return True
            if isinstance(kind, (ast.Break, ast.Continue)) and not nested_loop:
                return True
    return False


def _walk_same_function(node: ast.AST, inside_loop: bool):
    yield node, inside_loop
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        nested = inside_loop or (isinstance(node, (ast.For, ast.While)) and child in node.body)
        yield from _walk_same_function(child, nested)


class _Rewriter(ast.NodeTransformer):
    def __init__(self) -> None:
        self.counter = 0

    def _fresh(self, kind: str) -> str:
        self.counter += 1
        return f"{_RT}_{kind}{self.counter}"

    @staticmethod
    def _rt(attr: str) -> ast.expr:
        return ast.Attribute(value=ast.Name(id=_RT, ctx=ast.Load()), attr=attr, ctx=ast.Load())

    def _body_def(self, name: str, params: list[str], body: list[ast.stmt],
                  out: list[str]) -> ast.FunctionDef:
        ret = ast.Return(value=ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Load()) for n in out],
                                         ctx=ast.Load()))
        args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=p) for p in params],
                             kwonlyargs=[], kw_defaults=[], defaults=[])
        return ast.FunctionDef(name=name, args=args, body=list(body) + [ret],
                               decorator_list=[], returns=None, type_params=[])

    def _call_stmt(self, fn: str, args: list[ast.expr], names: list[str]) -> ast.stmt:
        call = ast.Call(func=self._rt(fn), args=args, keywords=[])
        if not names:
            return ast.Expr(value=call)
        target = ast.Tuple(elts=[ast.Name(id=n, ctx=ast.Store()) for n in names], ctx=ast.Store())
        return ast.Assign(targets=[target], value=call)

    def _names_and_inits(self, names: list[str]) -> list[ast.expr]:
        names_tuple = ast.Tuple(elts=[ast.Constant(n) for n in names], ctx=ast.Load())
        locals_call = ast.Call(func=ast.Name(id="locals", ctx=ast.Load()), args=[], keywords=[])
        inits = ast.Call(func=self._rt("init"), args=[locals_call, names_tuple], keywords=[])
        return [names_tuple, inits]

    # statements ----------------------------------------------------------------------
    def visit_If(self, node: ast.If) -> Any:
        self.generic_visit(node)
        if _has_escape(node.body + node.orelse, loop=False):
            return node
        names = _assigned_names(node.body + node.orelse)
        then_name, else_name = self._fresh("then"), self._fresh("else")
        then_def = self._body_def(then_name, names, node.body, names)
        else_def = self._body_def(else_name, names, node.orelse or [ast.Pass()], names)
        call = self._call_stmt("if_", [node.test, ast.Name(id=then_name, ctx=ast.Load()),
                                       ast.Name(id=else_name, ctx=ast.Load())]
                               + self._names_and_inits(names), names)
        return [then_def, else_def, call]

    def visit_For(self, node: ast.For) -> Any:
        it = node.iter
        is_range = (isinstance(it, ast.Call) and isinstance(it.func, ast.Name)
                    and it.func.id == "range" and not it.keywords
                    and isinstance(node.target, ast.Name))
        self.generic_visit(node)
        if not is_range or node.orelse or _has_escape(node.body, loop=True):
            return node
        it = ast.Call(func=it.func, args=node.iter.args[1:], keywords=[])  # undo call()
        names = [n for n in _assigned_names(node.body) if n != node.target.id]
        body_name = self._fresh("for")
        body_def = self._body_def(body_name, [node.target.id] + names, node.body, names)
        range_args = ast.Tuple(elts=list(it.args), ctx=ast.Load())
        call = self._call_stmt("for_", [range_args, ast.Name(id=body_name, ctx=ast.Load())]
                               + self._names_and_inits(names), names)
        return [body_def, call]

    def visit_While(self, node: ast.While) -> Any:
        self.generic_visit(node)
        if node.orelse or _has_escape(node.body, loop=True):
            return node
        names = _assigned_names(node.body)
        cond_name, body_name = self._fresh("cond"), self._fresh("while")
        cond_def = self._body_def(cond_name, names, [], [])
        cond_def.body = [ast.Return(value=node.test)]
        body_def = self._body_def(body_name, names, node.body, names)
        call = self._call_stmt("while_", [ast.Name(id=cond_name, ctx=ast.Load()),
                                          ast.Name(id=body_name, ctx=ast.Load())]
                               + self._names_and_inits(names), names)
        return [cond_def, body_def, call]

    # expressions ---------------------------------------------------------------------
    def visit_BoolOp(self, node: ast.BoolOp) -> Any:
        self.generic_visit(node)
        fn = "and_" if isinstance(node.op, ast.And) else "or_"
        result = node.values[0]
        for value in node.values[1:]:
            lam = ast.Lambda(args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                                                kw_defaults=[], defaults=[]), body=value)
            result = ast.Call(func=self._rt(fn), args=[result, lam], keywords=[])
        return result

    def visit_UnaryOp(self, node: ast.UnaryOp) -> Any:
        self.generic_visit(node)
        if isinstance(node.op, ast.Not):
            return ast.Call(func=self._rt("not_"), args=[node.operand], keywords=[])
        return node

    def visit_IfExp(self, node: ast.IfExp) -> Any:
        self.generic_visit(node)
        empty = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[])
        return ast.Call(func=self._rt("select"),
                        args=[node.test, ast.Lambda(args=empty, body=node.body),
                              ast.Lambda(args=empty, body=node.orelse)], keywords=[])

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        return ast.Call(func=self._rt("call"), args=[node.func] + node.args,
                        keywords=node.keywords)


class _Runtime:
    """What the rewritten code reaches through the `__pd` name."""
    init = staticmethod(control.init)
    if_ = staticmethod(control.if_)
    for_ = staticmethod(control.for_)
    while_ = staticmethod(control.while_)
    and_ = staticmethod(control.and_)
    or_ = staticmethod(control.or_)
    not_ = staticmethod(control.not_)
    select = staticmethod(control.select)

    @staticmethod
    def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return traceable(fn)(*args, **kwargs)


_factories: dict[tuple, Callable] = {}


def _factory(code: types.CodeType, source_fn: Callable) -> Callable:
    # Code objects compare equal across files (co_filename is not part of ==), and the factory
    # binds the function's module globals: key on both, or a same-shaped function in another
    # module would run with the first one's globals (its helpers, constants).
    key = (code, code.co_filename, id(source_fn.__globals__))
    if key not in _factories:
        _factories[key] = _build_factory(code, source_fn)
    return _factories[key]


def _build_factory(code: types.CodeType, source_fn: Callable) -> Callable:
    try:
        lines, first = inspect.getsourcelines(source_fn)
    except (OSError, TypeError) as e:
        raise TraceError(f"cannot read the source of {source_fn.__qualname__}: {e}") from e
    tree = ast.parse(textwrap.dedent("".join(lines)))
    ast.increment_lineno(tree, first - 1)
    fdef = tree.body[0]
    if not isinstance(fdef, ast.FunctionDef):
        raise TraceError(f"{source_fn.__qualname__} is not a plain function definition")
    fdef.decorator_list = []
    fdef = _Rewriter().visit(fdef)
    freevars = list(code.co_freevars)
    factory_args = ast.arguments(posonlyargs=[], args=[ast.arg(arg=_RT)] +
                                 [ast.arg(arg=v) for v in freevars],
                                 kwonlyargs=[], kw_defaults=[], defaults=[])
    factory = ast.FunctionDef(name="__pd_factory", args=factory_args,
                              body=[fdef, ast.Return(value=ast.Name(id=fdef.name, ctx=ast.Load()))],
                              decorator_list=[], returns=None, type_params=[])
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    compiled = compile(module, code.co_filename, "exec")
    namespace: dict[str, Any] = {}
    exec(compiled, source_fn.__globals__, namespace)
    return namespace["__pd_factory"]


def _should_rewrite(fn: Any) -> bool:
    if not isinstance(fn, types.FunctionType) or fn.__name__ == "<lambda>":
        return False
    module = fn.__module__ or ""
    if module.split(".")[0] in _SKIP_ROOTS or module in _DSL_INTERNAL:
        return False
    return not getattr(fn, "__peerdsl_plain__", False)


def traceable(fn: Any) -> Any:
    """fn rewritten for tracing if it is user Python; anything else unchanged."""
    if isinstance(fn, types.MethodType) and _should_rewrite(fn.__func__):
        return types.MethodType(traceable(fn.__func__), fn.__self__)
    if not _should_rewrite(fn):
        return fn
    factory = _factory(fn.__code__, fn)
    cells = [c.cell_contents for c in (fn.__closure__ or ())]
    new = factory(_Runtime, *cells)
    new.__defaults__ = fn.__defaults__
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__peerdsl_plain__ = True  # already rewritten: calls go straight through
    return new


def plain(fn: Callable) -> Callable:
    """Mark a function to be called as-is from kernels (no rewrite)."""
    fn.__peerdsl_plain__ = True
    return fn
