"""MLIR text for casts, vectors, thread geometry, pointers and memory (control flow:
_gen_control.py).

A mixin of `mlir_gen._Gen` (which provides emit/val/use/bind/check/scope/op).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..dsl import ir
from ._gen_control import ControlMixin, mlir_type
from ._gen_scoped import ScopedMixin
from ._gen_streaming import StreamingMixin
from .errors import LoweringError


_ORDER = {"relaxed": "monotonic", "acquire": "acquire", "release": "release",
          "acq_rel": "acq_rel"}
_RMW = {"add": "add", "max": "max", "umax": "umax", "xchg": "xchg"}
_FP8 = {"e4m3fn": (448.0, 7), "e4m3fnuz": (240.0, 8)}  # max, exponent bias


def float_literal(value: float, t: ir.ScalarType) -> str:
    """Exact hex bit pattern, so no decimal round trip can change a constant. Rounded as the
    simulator does: numpy's double -> f32 / f16 (RNE, overflow to inf); bf16 via f32."""
    with np.errstate(over="ignore"):
        f = np.float32(value)
        if t is ir.f16:
            return "0x%04X" % int(np.float16(value).view(np.uint16))
    bits = int(f.view(np.uint32))
    if t is ir.f32:
        return "0x%08X" % bits
    if (bits & 0x7F800000) == 0x7F800000 and bits & 0x7FFFFF:
        return "0x7FC0"
    bits += 0x7FFF + ((bits >> 16) & 1)  # bf16: nearest even from the f32 bits
    return "0x%04X" % ((bits >> 16) & 0xFFFF)


def _elem_bytes(t: Any) -> int:
    return t.nbytes if isinstance(t, (ir.ScalarType, ir.VectorType)) else 8


class OpsMixin(ScopedMixin, StreamingMixin, ControlMixin):
    # ------------------------------------------------------------------ casts
    def op_cast(self, op: ir.Op) -> None:
        kind, src, dst = op.attrs["kind"], op.operands[0].type, op.result.type
        x, r = self.use(op.operands[0]), None
        s, d = mlir_type(src), mlir_type(dst)
        ints = isinstance(src, ir.ScalarType) and isinstance(dst, ir.ScalarType)
        if kind in ("sext", "zext", "trunc"):
            self.check(ints and src.is_int and dst.is_int, f"{kind} of {src} to {dst}")
            wider = dst.bits > src.bits
            self.check(wider == (kind != "trunc"), f"{kind} from {src.bits} to {dst.bits} bits")
            r = {"sext": "arith.extsi", "zext": "arith.extui", "trunc": "arith.trunci"}[kind]
            self.emit(f"{self.bind(op.result)} = {r} {x} : {s} to {d}")
        elif kind == "sitofp":
            self.check(ints and src.is_int and dst.is_float, f"sitofp of {src} to {dst}")
            self.emit(f"{self.bind(op.result)} = arith.sitofp {x} : {s} to {d}")
        elif kind == "fptosi":
            # Saturating: out-of-range gives INT_MIN/INT_MAX and NaN gives 0, as the hardware
            # conversions do (plain fptosi would be poison there).
            self.check(ints and src.is_float and dst.is_int, f"fptosi of {src} to {dst}")
            self.emit(f'{self.bind(op.result)} = llvm.call_intrinsic "llvm.fptosi.sat.{d}.{s}"'
                      f"({x}) : ({s}) -> {d}")
        elif kind in ("extf", "truncf"):
            self.check(ints and src.is_float and dst.is_float
                       and (dst.bits > src.bits) == (kind == "extf"), f"{kind} {src} to {dst}")
            self.emit(f"{self.bind(op.result)} = arith.{kind} {x} : {s} to {d}")  # RNE
        elif kind == "bitcast":
            self.check(_elem_bytes(src) == _elem_bytes(dst) and not isinstance(src, ir.PtrType),
                       f"bitcast {src} -> {dst} changes size")
            self.emit(f"{self.bind(op.result)} = llvm.bitcast {x} : {s} to {d}")
        elif kind == "fp8":
            self.check(src is ir.f32 and dst is ir.i8, f"fp8 cast of {src} to {dst}")
            fmt = op.attrs.get("fmt", self.t.fp8_format)
            self.check(fmt in _FP8, f"fp8 format {fmt!r} is not one of {sorted(_FP8)}")
            self.names[op.result.id] = self.fp8_encode(x, fmt)
        else:
            raise self.err(f"unknown cast kind {kind!r}")

    def _bin(self, name: str, a: str, b: str, t: str = "i32") -> str:
        return self.val(f"arith.{name} {a}, {b} : {t}")

    def _fconst(self, v: float) -> str:
        return self.val(f"arith.constant {float_literal(v, ir.f32)} : f32")

    def fp8_encode(self, x: str, fmt: str) -> str:
        """f32 -> e4m3 byte: clamp, then round to nearest even with integer steps (as the sim)."""
        fmax, bias = _FP8[fmt]
        b, c = self._bin, self.const
        hi, lo = self._fconst(fmax), self._fconst(-fmax)
        x = self.val(self.intr("minnum", [x, hi], "f32"))
        x = self.val(self.intr("maxnum", [x, lo], "f32"))
        bits = self.val(f"arith.bitcast {x} : f32 to i32")
        sign = b("andi", b("shrui", bits, c(31)), c(1))
        mag = b("andi", bits, c(0x7FFFFFFF))
        # normal: round the 23-bit mantissa to 3 bits (a carry into the exponent is correct)
        odd = b("andi", b("shrui", mag, c(20)), c(1))
        rnd = b("addi", b("addi", mag, c(0x7FFFF)), odd)
        normal = b("subi", b("shrui", rnd, c(20)), c((127 - bias) << 3))
        # subnormal: |x| / 2^(1 - bias - 3) rounded to an integer by the 2^23 trick (exact)
        magic = self._fconst(8388608.0)
        magf = self.val(f"arith.bitcast {mag} : i32 to f32")
        scaled = b("mulf", magf, self._fconst(float(2 ** (bias - 1 + 3))), "f32")
        sub_f = b("subf", b("addf", scaled, magic, "f32"), magic, "f32")
        sub = self.val(f'llvm.call_intrinsic "llvm.fptosi.sat.i32.f32"({sub_f}) : (f32) -> i32')
        is_n = self.val(f"arith.cmpi sge, {mag}, {c((127 + 1 - bias) << 23)} : i32")
        code = self.val(f"arith.select {is_n}, {normal}, {sub} : i32")
        if fmt == "e4m3fnuz":  # no negative zero: 0x80 is NaN there
            nz = self.val(f"arith.cmpi ne, {code}, {c(0)} : i32")
            sign = self.val(f"arith.select {nz}, {sign}, {c(0)} : i32")
        byte = b("ori", b("shli", sign, c(7)), code)
        return self.val(f"arith.trunci {byte} : i32 to i8")

    def op_fp8_to_f32(self, op: ir.Op) -> None:
        fmt = op.attrs.get("fmt", self.t.fp8_format)
        self.check(fmt in _FP8 and op.operands[0].type is ir.i8, f"fp8_to_f32 ({fmt})")
        _, bias = _FP8[fmt]
        b, c = self._bin, self.const
        u = self.val(f"arith.extui {self.use(op.operands[0])} : i8 to i32")
        sign = b("shli", b("shrui", u, c(7)), c(31))
        e = b("andi", b("shrui", u, c(3)), c(15))
        m = b("andi", u, c(7))
        nbits = b("ori", b("shli", b("addi", e, c(127 - bias)), c(23)), b("shli", m, c(20)))
        mf = self.val(f"arith.sitofp {m} : i32 to f32")
        sub_f = b("mulf", mf, self._fconst(2.0 ** (1 - bias - 3)), "f32")
        sub = self.val(f"arith.bitcast {sub_f} : f32 to i32")
        is_sub = self.val(f"arith.cmpi eq, {e}, {c(0)} : i32")
        mag = self.val(f"arith.select {is_sub}, {sub}, {nbits} : i32")
        if fmt == "e4m3fn":  # S.1111.111 is NaN; no infinities
            is_nan = self.val(f"arith.cmpi eq, {b('andi', u, c(0x7F))}, {c(0x7F)} : i32")
        else:  # fnuz: only 0x80 is NaN
            is_nan = self.val(f"arith.cmpi eq, {u}, {c(0x80)} : i32")
        mag = self.val(f"arith.select {is_nan}, {c(0x7FC00000)}, {mag} : i32")
        res = b("ori", mag, sign)
        self.emit(f"{self.bind(op.result)} = arith.bitcast {res} : i32 to f32")

    # ------------------------------------------------------------------ vectors
    def op_vec_extract(self, op: ir.Op) -> None:
        vt, i = op.operands[0].type, op.attrs["index"]
        self.check(isinstance(vt, ir.VectorType) and 0 <= i < vt.count and op.result.type == vt.elem,
                   f"vec_extract {i} of {vt}")
        idx = self.const(i)
        self.emit(f"{self.bind(op.result)} = llvm.extractelement {self.use(op.operands[0])}"
                  f"[{idx} : i32] : {mlir_type(vt)}")

    def op_vec_build(self, op: ir.Op) -> None:
        vt = op.result.type
        self.check(isinstance(vt, ir.VectorType) and len(op.operands) == vt.count
                   and all(o.type == vt.elem for o in op.operands), f"vec_build of {vt}")
        t = mlir_type(vt)
        v = self.val(f"llvm.mlir.poison : {t}")
        for i, o in enumerate(op.operands):
            idx = self.const(i)
            v = self.val(f"llvm.insertelement {self.use(o)}, {v}[{idx} : i32] : {t}")
        self.names[op.result.id] = v

    # ------------------------------------------------------------------ geometry
    def op_special(self, op: ir.Op) -> None:
        which = op.attrs["which"]
        self.check(which in ("thread_id", "block_id", "grid_dim"), f"special {which!r}")
        if which == "grid_dim" and self.t.is_amd:
            # gpu.grid_dim becomes a device-library call on ROCDL; the HSA dispatch packet
            # has grid_size_x (work-items) at byte 12 and the block size is a constant.
            dp = self.val('llvm.call_intrinsic "llvm.amdgcn.dispatch.ptr"() : () -> !llvm.ptr<4>')
            p = self.val(f"llvm.getelementptr inbounds {dp}[12] : (!llvm.ptr<4>) -> !llvm.ptr<4>, i8")
            n = self.val(f"llvm.load {p} invariant {{alignment = 4 : i64}} : !llvm.ptr<4> -> i32")
            self.emit(f"{self.bind(op.result)} = arith.divui {n}, {self.const(self.k.block_size)} : i32")
            return
        name = {"thread_id": "gpu.thread_id", "block_id": "gpu.block_id",
                "grid_dim": "gpu.grid_dim"}[which]
        i = self.val(f"{name} x")
        self.emit(f"{self.bind(op.result)} = arith.index_cast {i} : index to i32")

    def op_shfl_xor(self, op: ir.Op) -> None:
        t, mask, width = op.operands[0].type, op.attrs["mask"], op.attrs["width"]
        self.check(t in (ir.f32, ir.i32) and 0 < mask < width <= 32 and width & (width - 1) == 0,
                   f"shfl_xor of {t} mask {mask} width {width}")
        m, w = self.const(mask), self.const(width)
        self.emit(f"{self.bind(op.result)}, {self.fresh()} = gpu.shuffle xor "
                  f"{self.use(op.operands[0])}, {m}, {w} : {t}")

    def op_schedule_fence(self, op: ir.Op) -> None:
        if self.t.schedule_fences:  # mask 0: no instruction may cross it
            self.emit('llvm.call_intrinsic "llvm.amdgcn.sched.barrier"(%s) : (i32) -> ()'
                      % self.const(0))

    def op_globaltimer(self, op: ir.Op) -> None:
        # readsteadycounter: %globaltimer (ns) on NVPTX, the 100 MHz realtime counter on AMDGPU
        n = self.val('llvm.call_intrinsic "llvm.readsteadycounter"() : () -> i64')
        if self.t.timer_ns_per_tick == 1:
            self.names[op.result.id] = n
        else:
            k = self.const(self.t.timer_ns_per_tick, "i64")
            self.emit(f"{self.bind(op.result)} = arith.muli {n}, {k} : i64")

    # ------------------------------------------------------------------ pointers
    def op_ptr_offset(self, op: ir.Op) -> None:
        p, idx = op.operands
        self.check(isinstance(p.type, ir.PtrType) and idx.type in (ir.i32, ir.i64),
                   f"ptr_offset of {p.type} by {idx.type}")
        t = mlir_type(p.type)
        # the index is signed (GEP sign-extends) and counts elements of the pointee type
        self.emit(f"{self.bind(op.result)} = llvm.getelementptr {self.use(p)}[{self.use(idx)}] : "
                  f"({t}, {idx.type}) -> {t}, {mlir_type(p.type.elem)}")

    def op_ptr_cast(self, op: ir.Op) -> None:
        src, dst = op.operands[0].type, op.result.type
        self.check(isinstance(dst, ir.PtrType) and isinstance(src, ir.PtrType)
                   and src.space == dst.space, f"ptr_cast {src} -> {dst}")
        self.names[op.result.id] = self.use(op.operands[0])  # opaque pointers: same value

    def op_int_to_ptr(self, op: ir.Op) -> None:
        src = op.operands[0]
        self.check(src.type == ir.i64 and isinstance(op.result.type, ir.PtrType),
                   f"int_to_ptr of {src.type} to {op.result.type}")
        self.emit(f"{self.bind(op.result)} = llvm.inttoptr {self.use(src)} : i64 to "
                  f"{mlir_type(op.result.type)}")

    def op_ptr_select(self, op: ir.Op) -> None:
        idx, ptrs = op.operands[0], op.operands[1:]
        self.check(idx.type in (ir.i32, ir.i64) and ptrs and all(p.type == op.result.type for p in ptrs),
                   "ptr_select needs an integer index and pointers of one type")
        t, i = mlir_type(op.result.type), self.use(idx)
        r = self.use(ptrs[0])
        for k, p in enumerate(ptrs[1:], 1):
            eq = self.val(f"arith.cmpi eq, {i}, {self.const(k, idx.type.name)} : {idx.type}")
            r = self.val(f"llvm.select {eq}, {self.use(p)}, {r} : i1, {t}")
        self.names[op.result.id] = r

    # ------------------------------------------------------------------ memory
    def _access(self, op: ir.Op, ptr: ir.Value, vt: Any, store: bool) -> tuple[str, str, str]:
        """(prefix after the op name, atomic suffix, attr dict) of a load or store."""
        scope, order, nt = op.attrs.get("scope"), op.attrs.get("order"), op.attrs.get("nontemporal")
        self.check(isinstance(ptr.type, ir.PtrType) and ptr.type.elem == vt,
                   f"access of {vt} through {ptr.type}")
        attrs = [f"alignment = {_elem_bytes(vt)} : i64"] + (["nontemporal"] if nt else [])
        if scope is None:
            return "", "", "{" + ", ".join(attrs) + "}"
        self.check(scope in dict(self.t.syncscopes), f"unknown scope {scope!r}")
        if isinstance(vt, ir.VectorType):
            # no atomic vectors: one volatile 16-byte access, relaxed (ir.py semantics);
            # op_load/op_store use the av intrinsics instead where av_pack says so
            self.check(order in (None, "relaxed"), f"vector access cannot be {order}")
            return "volatile ", "", "{" + ", ".join(attrs) + "}"
        self.check(vt is not ir.i1, "atomic access of i1")
        allowed = ("relaxed", "release") if store else ("relaxed", "acquire")
        self.check(order in allowed, f"{'store' if store else 'load'} order {order!r}")
        return "", f" atomic {self.scope(scope)}{_ORDER[order]}", "{" + ", ".join(attrs) + "}"

    def op_load(self, op: ir.Op) -> None:
        p, vt = op.operands[0], op.result.type
        pre, atom, attrs = self._access(op, p, vt, store=False)
        if self.av_pack(op, vt):
            return self.av_load(op, mlir_type(p.type), mlir_type(vt))
        if self.nv_streaming(op, vt, p):
            return self.streaming_load(op, mlir_type(p.type), mlir_type(vt))
        self.emit(f"{self.bind(op.result)} = llvm.load {pre}{self.use(p)}{atom} {attrs} : "
                  f"{mlir_type(p.type)} -> {mlir_type(vt)}")

    def op_store(self, op: ir.Op) -> None:
        p, v = op.operands
        pre, atom, attrs = self._access(op, p, v.type, store=True)
        if self.av_pack(op, v.type):
            return self.av_store(op, mlir_type(p.type), mlir_type(v.type))
        if self.nv_streaming(op, v.type, p):
            return self.streaming_store(op, mlir_type(p.type), mlir_type(v.type))
        self.emit(f"llvm.store {pre}{self.use(v)}, {self.use(p)}{atom} {attrs} : "
                  f"{mlir_type(v.type)}, {mlir_type(p.type)}")

    def _rmw_check(self, op: ir.Op, ptr: ir.Value, vals: list) -> str:
        self.check(isinstance(ptr.type, ir.PtrType) and all(v.type == ptr.type.elem for v in vals)
                   and op.result.type == ptr.type.elem, f"{op.name} operand types")
        self.check(op.attrs.get("order") in _ORDER, f"order {op.attrs.get('order')!r}")
        self.check(op.attrs.get("scope") in dict(self.t.syncscopes), "unknown scope")
        return mlir_type(ptr.type.elem)

    def op_atomic(self, op: ir.Op) -> None:
        p, v = op.operands
        t = self._rmw_check(op, p, [v])
        kind = op.attrs["kind"]
        self.check(kind in _RMW, f"atomic kind {kind!r}")
        if p.type.elem.is_float:
            self.check(kind == "add" and p.type.elem is ir.f32, f"float atomic {kind}")
            kind = "fadd"
        else:
            self.check(p.type.elem in (ir.i32, ir.i64), f"atomic on {p.type.elem}")
        self.emit(f"{self.bind(op.result)} = llvm.atomicrmw {_RMW.get(kind, kind)} {self.use(p)}, "
                  f"{self.use(v)} {self.scope(op.attrs['scope'])}{_ORDER[op.attrs['order']]} "
                  f"{{alignment = {_elem_bytes(v.type)} : i64}} : {mlir_type(p.type)}, {t}")

    def op_cas(self, op: ir.Op) -> None:
        p, e, d = op.operands
        t = self._rmw_check(op, p, [e, d])
        self.check(p.type.elem in (ir.i32, ir.i64), f"compare-swap on {p.type.elem}")
        order = op.attrs["order"]
        fail = "acquire" if order in ("acquire", "acq_rel") else "monotonic"  # no release on fail
        s = self.val(f"llvm.cmpxchg {self.use(p)}, {self.use(e)}, {self.use(d)} "
                     f"{self.scope(op.attrs['scope'])}{_ORDER[order]} {fail} "
                     f"{{alignment = {_elem_bytes(e.type)} : i64}} : {mlir_type(p.type)}, {t}")
        self.emit(f"{self.bind(op.result)} = llvm.extractvalue {s}[0] : !llvm.struct<({t}, i1)>")

    def op_fence(self, op: ir.Op) -> None:
        order = op.attrs.get("order")
        self.check(order in ("acquire", "release", "acq_rel"), f"fence order {order!r}")
        self.check(op.attrs.get("scope") in dict(self.t.syncscopes), "unknown scope")
        self.emit(f"llvm.fence {self.scope(op.attrs['scope'])}{order}")

    def op_smem(self, op: ir.Op) -> None:
        raise self.err("smem must be hoisted to kernel scope (Kernel.shared)")
