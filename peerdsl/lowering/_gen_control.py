"""MLIR text for structured control flow: scf.if, scf.for and scf.while with the values they
carry, and their terminators. A mixin of `_gen_ops.OpsMixin` (which provides
emit/use/bind/check/region/names/lines/poll_depth)."""
from __future__ import annotations

from typing import Any

from ..dsl import ir
from .errors import LoweringError


def mlir_type(t: Any) -> str:
    """The MLIR type of a DSL value type (every lowering mixin names types through here)."""
    if isinstance(t, ir.PtrType):
        return "!llvm.ptr<3>" if t.space == "shared" else "!llvm.ptr<1>"
    if isinstance(t, ir.VectorType):
        return f"vector<{t.count}x{t.elem.name}>"
    if isinstance(t, ir.ScalarType):
        return t.name
    raise LoweringError(f"no MLIR type for {t!r}")


class ControlMixin:
    def _results(self, op: ir.Op) -> str:
        if not op.results:
            return ""
        base = f"%v{len(self.names)}"
        self.names[-1 - len(self.names)] = base  # reserve the number
        if len(op.results) == 1:
            self.names[op.results[0].id] = base
            return f"{base} = "
        for i, r in enumerate(op.results):
            self.names[r.id] = f"{base}#{i}"
        return f"{base}:{len(op.results)} = "

    def _types(self, vals: list) -> str:
        return ", ".join(mlir_type(v.type) for v in vals)

    def _close(self, text: str = "}") -> None:
        self.emit(text)  # carries the op's loc: the location of a region op follows its body

    def op_if(self, op: ir.Op) -> None:
        c = op.operands[0]
        self.check(c.type is ir.i1, f"if condition is {c.type}")
        cond = self.use(c)
        then_b, else_b = op.regions
        head = f"scf.if {cond}" + (f" -> ({self._types(op.results)})" if op.results else "") + " {"
        # results are bound after the regions: the regions cannot use them
        self.emit(f"{{RES}}{head}", with_loc=False)
        at = len(self.lines) - 1
        self.region(then_b)
        self.emit("} else {", with_loc=False)
        self.region(else_b)
        self.lines[at] = self.lines[at].replace("{RES}", self._results(op), 1)
        self._close()

    def op_for(self, op: ir.Op) -> None:
        lb, ub, step, *inits = op.operands
        body = op.regions[0]
        it = lb.type
        self.check(it in (ir.i32, ir.i64) and ub.type == it and step.type == it
                   and body.args[0].type == it, "for bounds must all be i32 or all i64")
        self.check([a.type for a in body.args[1:]] == [v.type for v in inits]
                   == [r.type for r in op.results], "for carried types differ")
        lbs, ubs, sts = self.use(lb), self.use(ub), self.use(step)
        init_s = [self.use(v) for v in inits]
        iv = self.bind(body.args[0])
        iters = [self.bind(a) for a in body.args[1:]]
        carried = ""
        if inits:
            pairs = ", ".join(f"{a} = {b}" for a, b in zip(iters, init_s))
            carried = f" iter_args({pairs}) -> ({self._types(inits)})"
        self.emit(f"{{RES}}scf.for {iv} = {lbs} to {ubs} step {sts}{carried} : {it} {{",
                  with_loc=False)
        at = len(self.lines) - 1
        self.region(body)
        self.lines[at] = self.lines[at].replace("{RES}", self._results(op), 1)
        self._close()

    def op_while(self, op: ir.Op) -> None:
        before, after = op.regions
        types = [v.type for v in op.operands]
        self.check([a.type for a in before.args] == types == [a.type for a in after.args]
                   == [r.type for r in op.results], "while carried types differ")
        init_s = [self.use(v) for v in op.operands]
        bargs = [self.bind(a) for a in before.args]
        pairs = ", ".join(f"{a} = {b}" for a, b in zip(bargs, init_s))
        ts = ", ".join(mlir_type(t) for t in types)
        self.emit(f"{{RES}}scf.while ({pairs}) : ({ts}) -> ({ts}) {{", with_loc=False)
        at = len(self.lines) - 1
        self.poll_depth += 1  # a poll may spin here: its pack loads stay volatile
        self.region(before)
        self.emit("} do {", with_loc=False)
        aargs = [f"{self.bind(a)}: {mlir_type(a.type)}" for a in after.args]
        self.region(after, header=f"^bb0({', '.join(aargs)}):")
        self.poll_depth -= 1
        self.lines[at] = self.lines[at].replace("{RES}", self._results(op), 1)
        self._close()

    def op_yield(self, op: ir.Op) -> None:
        vals = ", ".join(self.use(v) for v in op.operands)
        self.emit(f"scf.yield {vals} : {self._types(op.operands)}" if op.operands else "scf.yield")

    def op_condition(self, op: ir.Op) -> None:
        c, *vals = op.operands
        self.check(c.type is ir.i1, f"while condition is {c.type}")
        tail = f" {', '.join(self.use(v) for v in vals)} : {self._types(vals)}" if vals else ""
        self.emit(f"scf.condition({self.use(c)}){tail}")
