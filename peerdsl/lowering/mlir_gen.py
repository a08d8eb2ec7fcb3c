"""Kernel IR -> MLIR text (a gpu.module holding one gpu.func kernel).

Text, not the builder API: it needs no MLIR import (so it runs in the parent process and
its errors are plain Python exceptions), is cheap to generate, and the worker parses it
in one call. Every op carries `loc("file":line:0)` from the DSL source, and `line_locs`
maps MLIR text lines back to that source so parse errors can name the user's line too.

Semantics follow the catalogue in `peerdsl.dsl.ir` exactly; the comments say where a
choice was made to keep the targets and the simulator bit-identical.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from ..dsl import ir
from ._gen_ops import LoweringError, OpsMixin, float_literal as _float_literal, mlir_type
from .targets import Target, get_target

_INT_BIN = {"add": "arith.addi", "sub": "arith.subi", "mul": "arith.muli", "div": "arith.divsi",
            "rem": "arith.remsi", "min": "arith.minsi", "max": "arith.maxsi", "and": "arith.andi",
            "or": "arith.ori", "xor": "arith.xori", "shl": "arith.shli", "shr": "arith.shrui"}
# min/max: IEEE maxNum/minNum, a NaN operand loses. The LLVM intrinsics directly, because
# convert-gpu-to-nvvm turns arith.maxnumf/remf into libdevice calls (__nv_fmaxf) we never link.
# fmaximum: IEEE 754-2019 maximum, NaN propagates (v_maximum_f32 / max.NaN.f32).
_FLT_BIN = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
            "rem": "llvm.frem", "min": "llvm.intr.minnum", "max": "llvm.intr.maxnum",
            "fmaximum": "llvm.intr.maximum"}
_ICMP = {"lt": "slt", "le": "sle", "gt": "sgt", "ge": "sge", "eq": "eq", "ne": "ne",
         "wlt": "slt", "wge": "sge"}
# wrap-safe counter compares (epochs): a wlt b is (a - b) < 0 on the wrapping difference, so a
# counter that wrapped past 2^31 or 2^32 still compares by distance, never by magnitude
_WRAP_CMP = ("wlt", "wge")
# ordered compares, except ne which is unordered so NaN != NaN is true (as in Python / IEEE)
_FCMP = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}


def _sym(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


class _Gen(OpsMixin):
    """Arithmetic lives here; casts, memory, control flow in `_gen_ops.OpsMixin`."""

    def __init__(self, kernel: ir.Kernel, target: Target, symbol: str):
        self.k, self.t, self.symbol = kernel, target, symbol
        self.names: dict[int, str] = {}
        self.lines: list[str] = []
        self.line_locs: dict[int, str] = {}  # 1-based MLIR line -> DSL "file:line"
        self.tmp = 0
        self.depth = 2
        self.op: ir.Op | None = None

    # ------------------------------------------------------------------ helpers
    def err(self, msg: str) -> LoweringError:
        where = self.op.loc if self.op is not None and self.op.loc else "<unknown location>"
        name = self.op.name if self.op is not None else "?"
        return LoweringError(f"{where}: cannot lower `{name}` for {self.t.arch}: {msg}")

    def fresh(self) -> str:
        self.tmp += 1
        return f"%t{self.tmp}"

    def bind(self, v: ir.Value) -> str:
        n = f"%v{len(self.names)}"
        self.names[v.id] = n
        return n

    def use(self, v: ir.Value) -> str:
        try:
            return self.names[v.id]
        except KeyError:
            raise self.err("operand is not defined before use (IR not in SSA order)") from None

    def loc(self) -> str:
        if self.op is None or not self.op.loc:
            return ""
        path, _, line = self.op.loc.rpartition(":")
        if not line.isdigit():
            return ""
        path = path.replace("\\", "\\\\").replace('"', '\\"')
        return f' loc("{path}":{line}:0)'

    def emit(self, text: str, with_loc: bool = True) -> None:
        self.lines.append("  " * self.depth + text + (self.loc() if with_loc else ""))
        if self.op is not None and self.op.loc:
            self.line_locs[len(self.lines)] = self.op.loc

    def val(self, text: str) -> str:
        """Emit `%tN = text` and return %tN."""
        r = self.fresh()
        self.emit(f"{r} = {text}")
        return r

    def const(self, value: int, t: str = "i32") -> str:
        return self.val(f"arith.constant {value} : {t}")

    def scope(self, scope: str) -> str:
        s = self.t.syncscope(scope)
        return f'syncscope("{s}") ' if s else ""

    @staticmethod
    def intr(name: str, args: list[str], ty: str) -> str:
        """A float LLVM intrinsic as an opaque call: convert-gpu-to-nvvm would otherwise turn
        llvm.intr.sqrt/fabs/maxnum into libdevice calls (we link no libdevice, and
        llvm.sqrt.f32 / fdiv already lower to the correctly rounded sqrt.rn / div.rn)."""
        sig = ", ".join([ty] * len(args))
        return f'llvm.call_intrinsic "llvm.{name}.{ty}"({", ".join(args)}) : ({sig}) -> {ty}'

    def check(self, cond: bool, msg: str) -> None:
        if not cond:
            raise self.err(msg)

    # ------------------------------------------------------------------ module
    def module(self) -> str:
        k = self.k
        tgt = (f'#rocdl.target<chip = "{self.t.arch}", O = 3>' if self.t.is_amd
               else f'#nvvm.target<chip = "{self.t.arch}", O = 3>')
        self.lines += ["module attributes {gpu.container_module} {",
                       f"  gpu.module @peerdsl [{tgt}] {{"]
        smem_syms = []
        for i, op in enumerate(k.shared):
            self.op = op
            sym = f"smem{i}_{_sym(op.attrs['name'])}"
            elem = mlir_type(op.result.type.elem)
            self.check(isinstance(op.attrs.get("count"), int) and op.attrs["count"] > 0,
                       "shared array needs a positive constant count")
            self.emit(f"llvm.mlir.global internal @{sym}() {{addr_space = 3 : i32, "
                      f"alignment = 16 : i64}} : !llvm.array<{op.attrs['count']} x {elem}>")
            smem_syms.append((op, sym))
        self.op = None
        params = []
        for p in k.params:
            if not (isinstance(p.type, ir.PtrType) or p.type in (ir.i32, ir.i64, ir.f32)):
                raise LoweringError(f"kernel {k.name}: parameter {p.name} has type {p.type}; "
                                    "kernel parameters are pointers, i32, i64 or f32")
            params.append(f"{self.bind(p.value)}: {mlir_type(p.type)}")
        bs = k.block_size
        # The launch bound lets the register allocator use the budget of the real block size.
        # On NVIDIA, .maxntid alone makes ptxas aim at 3 blocks per SM (80 registers at 256
        # threads) and spill in the big fused kernels; .minnctapersm says how many blocks we
        # need, leaving each thread at least 128 registers (or all the block size allows),
        # unless the kernel asks for more blocks (dsl.kernel min_blocks).
        min_blocks = k.min_blocks or max(1, 65536 // (128 * bs))
        attr = (f'rocdl.flat_work_group_size = "{bs},{bs}"' if self.t.is_amd
                else f"nvvm.maxntid = array<i32: {bs}, 1, 1>, nvvm.minctasm = {min_blocks} : i32")
        if not self.t.auto_vectorize:
            # LLVM's documented switch for "no vectorizing of scalar code" (SLP and the
            # load/store vectorizer): see targets.py auto_vectorize. (convert-gpu-to-rocdl
            # keeps an `llvm.`-prefixed attribute and passes it to the llvm.func.)
            attr = 'llvm.passthrough = ["noimplicitfloat"], ' + attr
        self.lines.append(f"    gpu.func @{self.symbol}({', '.join(params)}) kernel "
                          f"attributes {{{attr}}} {{")
        self.depth = 3
        for op, sym in smem_syms:
            self.op = op
            self.emit(f"{self.bind(op.result)} = llvm.mlir.addressof @{sym} : !llvm.ptr<3>")
        self.block(k.body)
        self.op = None
        self.emit("gpu.return")
        self.lines += ["    }", "  }", "}"]
        return "\n".join(self.lines) + "\n"

    def block(self, block: ir.Block) -> None:
        for op in block.ops:
            self.op = op
            fn: Callable[[ir.Op], None] | None = getattr(self, "op_" + op.name, None)
            if fn is None:
                if op.name in _INT_BIN or op.name in _FLT_BIN:
                    fn = self.binary
                else:
                    raise self.err("unknown op (not in the ir.py catalogue)")
            fn(op)

    def region(self, block: ir.Block, header: str | None = None) -> None:
        """Emit a region body; the terminator (yield/condition) is the block's last op."""
        self.depth += 1
        if header is not None:
            self.lines.append("  " * (self.depth - 1) + header)
        self.block(block)
        self.depth -= 1

    # ------------------------------------------------------------------ arithmetic
    def same_types(self, op: ir.Op, n: int) -> Any:
        self.check(len(op.operands) == n, f"expects {n} operands, got {len(op.operands)}")
        t = op.operands[0].type
        for o in op.operands[1:]:
            self.check(o.type == t, f"operand types differ: {t} and {o.type}")
        if op.results:
            self.check(op.result.type == (ir.i1 if op.name == "cmp" else t),
                       f"result type {op.result.type} does not match operands {t}")
        return t

    def binary(self, op: ir.Op) -> None:
        t = self.same_types(op, 2)
        self.check(isinstance(t, ir.ScalarType), f"operands must be scalars, got {t}")
        table = _FLT_BIN if t.is_float else _INT_BIN
        self.check(op.name in table, f"{op.name} is not defined on {t}")
        a, b = map(self.use, op.operands)
        name, ty = table[op.name], mlir_type(t)
        if name.startswith("llvm.intr."):
            self.emit(f"{self.bind(op.result)} = {self.intr(name[10:], [a, b], ty)}")
            return
        if t.is_int and t is not ir.i1 and op.name in ("shl", "shr"):
            # LLVM makes a shift by >= the width poison; the sim (and AMD hardware) use the
            # amount modulo the width. Constant amounts fold the mask away.
            b = self.val(f"arith.andi {b}, {self.const(max(t.bits, 8) - 1, ty)} : {ty}")
        elif t.is_int and t is not ir.i1 and op.name in ("div", "rem"):
            a, b, zero = self._safe_divisor(a, b, ty, t.bits)
            if op.name == "div":  # x / 0 is 0 in the sim; x % 0 is x % 1 = 0 already
                q = self.val(f"arith.divsi {a}, {b} : {ty}")
                self.emit(f"{self.bind(op.result)} = arith.select {zero}, "
                          f"{self.const(0, ty)}, {q} : {ty}")
                return
        self.emit(f"{self.bind(op.result)} = {name} {a}, {b} : {ty}")

    def _safe_divisor(self, a: str, b: str, ty: str, bits: int) -> tuple[str, str, str]:
        """Division by 0 and MIN / -1 are UB in LLVM; the sim defines them (0; MIN and 0).
        Divide by 1 instead in those cases, which gives the sim's results."""
        zero = self.val(f"arith.cmpi eq, {b}, {self.const(0, ty)} : {ty}")
        is_min = self.val(f"arith.cmpi eq, {a}, {self.const(-(1 << (bits - 1)), ty)} : {ty}")
        is_m1 = self.val(f"arith.cmpi eq, {b}, {self.const(-1, ty)} : {ty}")
        ovf = self.val(f"arith.andi {is_min}, {is_m1} : i1")
        bad = self.val(f"arith.ori {zero}, {ovf} : i1")
        return a, self.val(f"arith.select {bad}, {self.const(1, ty)}, {b} : {ty}"), zero

    def op_const(self, op: ir.Op) -> None:
        t, v = op.result.type, op.attrs["value"]
        self.check(isinstance(t, ir.ScalarType), f"constant of {t}")
        if t is ir.i1:
            lit = "true" if v else "false"
        elif t.is_float:
            lit = _float_literal(float(v), t)
        else:
            v = int(v) & ((1 << t.bits) - 1)  # two's complement bits, printed signed
            lit = str(v - (1 << t.bits) if v >> (t.bits - 1) else v)
        ty = "" if t is ir.i1 else f" : {t.name}"  # a bool literal carries its type
        self.emit(f"{self.bind(op.result)} = arith.constant {lit}{ty}")

    def op_fma(self, op: ir.Op) -> None:
        t = self.same_types(op, 3)
        self.check(t.is_float if isinstance(t, ir.ScalarType) else False, f"fma of {t}")
        a, b, c = map(self.use, op.operands)
        self.emit(f"{self.bind(op.result)} = {self.intr('fma', [a, b, c], t.name)}")

    def unary_float(self, op: ir.Op) -> tuple[str, str]:
        t = self.same_types(op, 1)
        self.check(isinstance(t, ir.ScalarType) and t.is_float, f"{op.name} needs a float, got {t}")
        return self.use(op.operands[0]), t.name

    def op_sqrt(self, op: ir.Op) -> None:
        # llvm.sqrt is correctly rounded on both backends (no afn / !fpmath); math.sqrt would
        # become an ocml/libdevice call.
        x, t = self.unary_float(op)
        self.emit(f"{self.bind(op.result)} = {self.intr('sqrt', [x], t)}")

    def op_rsqrt(self, op: ir.Op) -> None:
        x, t = self.unary_float(op)  # 1 / sqrt(x): two correctly rounded steps, as the sim
        s = self.val(self.intr("sqrt", [x], t))
        one = self.val(f"arith.constant {_float_literal(1.0, op.result.type)} : {t}")
        self.emit(f"{self.bind(op.result)} = arith.divf {one}, {s} : {t}")

    def op_rcp(self, op: ir.Op) -> None:
        x, t = self.unary_float(op)
        one = self.val(f"arith.constant {_float_literal(1.0, op.result.type)} : {t}")
        self.emit(f"{self.bind(op.result)} = arith.divf {one}, {x} : {t}")

    def op_neg(self, op: ir.Op) -> None:
        t = self.same_types(op, 1)
        x = self.use(op.operands[0])
        if t.is_float:
            self.emit(f"{self.bind(op.result)} = arith.negf {x} : {t}")
        else:
            zero = self.val(f"arith.constant 0 : {t}")
            self.emit(f"{self.bind(op.result)} = arith.subi {zero}, {x} : {t}")

    def op_abs(self, op: ir.Op) -> None:
        t = self.same_types(op, 1)
        x = self.use(op.operands[0])
        if t.is_float:
            self.emit(f"{self.bind(op.result)} = {self.intr('fabs', [x], t.name)}")
            return
        zero = self.val(f"arith.constant 0 : {t}")
        neg = self.val(f"arith.subi {zero}, {x} : {t}")
        lt = self.val(f"arith.cmpi slt, {x}, {zero} : {t}")
        self.emit(f"{self.bind(op.result)} = arith.select {lt}, {neg}, {x} : {t}")

    def op_not(self, op: ir.Op) -> None:
        t = self.same_types(op, 1)
        self.check(t.is_int, f"not of {t}")
        ones = self.val("arith.constant true" if t is ir.i1 else f"arith.constant -1 : {t}")
        self.emit(f"{self.bind(op.result)} = arith.xori {self.use(op.operands[0])}, {ones} : {t}")

    def op_cmp(self, op: ir.Op) -> None:
        t = self.same_types(op, 2)
        pred = op.attrs["pred"]
        table = _FCMP if t.is_float else _ICMP
        self.check(pred in table, f"unknown predicate {pred!r}")
        kind = "arith.cmpf" if t.is_float else "arith.cmpi"
        a, b = map(self.use, op.operands)
        if pred in _WRAP_CMP:  # the sign of the wrapping difference (no nsw: it may wrap)
            diff = self.val(f"arith.subi {a}, {b} : {t}")
            a, b = diff, self.const(0, str(t))
        self.emit(f"{self.bind(op.result)} = {kind} {table[pred]}, {a}, {b} : {t}")

    def op_select(self, op: ir.Op) -> None:
        c, a, b = op.operands
        self.check(c.type is ir.i1, f"select condition is {c.type}, not i1")
        self.check(a.type == b.type == op.result.type, f"select of {a.type} and {b.type}")
        t = mlir_type(a.type)
        kind = "llvm.select" if isinstance(a.type, (ir.PtrType, ir.VectorType)) else "arith.select"
        if kind == "llvm.select":
            self.emit(f"{self.bind(op.result)} = llvm.select {self.use(c)}, {self.use(a)}, "
                      f"{self.use(b)} : i1, {t}")
        else:
            self.emit(f"{self.bind(op.result)} = arith.select {self.use(c)}, {self.use(a)}, "
                      f"{self.use(b)} : {t}")



def generate(kernel: ir.Kernel, target: "str | Target", symbol: str | None = None
             ) -> tuple[str, dict[int, str]]:
    """MLIR text for `kernel` on `target`, and a map MLIR line -> DSL source "file:line"."""
    t = get_target(target)
    g = _Gen(kernel, t, symbol or kernel.name)
    return g.module(), g.line_locs
