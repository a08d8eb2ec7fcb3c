"""Compile an `ir.Kernel` once into Python closures over numpy lane arrays, and run a block.

The simulator executes whatever IR it is given; nothing here knows about any op of ops/.
A block is simulated as a whole (SIMT over `block_size` lanes): every SSA value is one numpy
array with the lanes on axis 0. Pure ops run on every lane (values of inactive lanes are
garbage nobody reads: SSA values do not escape their region except through `yield`); memory
ops act only on the active lanes of the current mask. Divergent `if` runs both regions under
complementary masks and merges the yielded values per lane; `for`/`while` iterate while any
lane is active. `run` is a generator: it yields at every global memory op, fence and
barrier, and at the back-edge of loops without memory ops, which is where the scheduler
interleaves blocks of all ranks. Global memory goes through the memory model (weak.py);
shared memory through the block's race detector (shared.py). A barrier reached by only
part of the block is an error.

Closures come in three kinds, so the hot loop does no lookups: 0 = pure `f(regs)`,
1 = needs the block context `f(regs, mask, ctx)`, 2 = generator `f(regs, mask, ctx)`.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np

from ...dsl import ir
from ..errors import SimError
from . import numerics as nx
from .ops_table import compile_pure
from .memory import GlobalMemory, apply_atomic
from .weak import BLOCK, DEVICE, MEMORY

Code = tuple  # of (fn, kind)
_DRAIN_SCOPES = ("agent", "system")


class Program:
    """A compiled kernel: register slots, constants, and the closure tree."""

    def __init__(self, kernel: ir.Kernel):
        self.name = kernel.name
        self.lanes = kernel.block_size
        self.slots: dict[int, int] = {}
        self.template: list[Any] = []
        self.specials: list[tuple[int, str]] = []
        self.params = [(p.name, self.slot(p.value), p.type) for p in kernel.params]
        self.smem: list[tuple[int, int]] = []
        self.smem_names: list[tuple[int, str]] = []
        total = 0
        for op in kernel.shared:
            total = (total + 15) // 16 * 16
            self.smem.append((self.slot(op.result), total))
            self.smem_names.append((total, op.attrs["name"]))
            total += op.result.type.elem.nbytes * op.attrs["count"]
        self.shared_bytes = total
        self.body, _ = self.region(kernel.body)

    def slot(self, v: ir.Value) -> int:
        s = self.slots.get(v.id)
        if s is None:
            s = self.slots[v.id] = len(self.template)
            self.template.append(None)
        return s

    def region(self, block: ir.Block) -> tuple[Code, list[int]]:
        """Closures of a region and the slots its terminator passes on."""
        code: list[tuple[Callable, int]] = []
        term: list[int] = []
        for op in block.ops:
            if op.name in ("yield", "condition"):
                term = [self.slot(v) for v in op.operands]
                continue
            compiled = self.op(op)
            if compiled is not None:
                code.append(compiled)
        return tuple(code), term

    def op(self, op: ir.Op):
        name = op.name
        if name == "const":
            t = op.result.type
            self.template[self.slot(op.result)] = nx.const_array(op.attrs["value"], t, self.lanes)
            return None
        if name == "special":
            self.specials.append((self.slot(op.result), op.attrs["which"]))
            return None
        ins = [self.slot(v) for v in op.operands]
        outs = [self.slot(v) for v in op.results]
        if name in ("if", "for", "while"):
            return getattr(self, "_" + name)(op, ins, outs), 2
        if name in ("load", "store", "atomic", "cas", "fence", "barrier"):
            return _memory_op(op, ins, outs, self.lanes)
        if name == "schedule_fence":  # a compiler scheduling boundary: nothing to execute
            return None
        if name == "globaltimer":
            o = outs[0]
            lanes = self.lanes

            def timer(r, m, ctx):
                r[o] = np.full(lanes, ctx.clock(), np.int64)
            return timer, 1
        return compile_pure(op, ins, outs, self.lanes), 0

    # ------------------------------------------------------------------ control flow
    def _if(self, op: ir.Op, ins, outs):
        then, tterm = self.region(op.regions[0])
        els, eterm = self.region(op.regions[1])
        cs = ins[0]
        pairs = list(zip(outs, tterm, eterm))

        def f_if(r, m, ctx):
            c = r[cs]
            tm = c if m is None else (c & m)
            em = ~c if m is None else (m & ~c)
            t_any, e_any = tm.any(), em.any()
            if t_any and not e_any:
                yield from run(then, r, m, ctx)
                for o, t, _ in pairs:
                    r[o] = r[t]
            elif e_any and not t_any:
                yield from run(els, r, m, ctx)
                for o, _, e in pairs:
                    r[o] = r[e]
            elif t_any:
                yield from run(then, r, tm, ctx)
                tv = [r[t] for _, t, _ in pairs]
                yield from run(els, r, em, ctx)
                for (o, _, e), t in zip(pairs, tv):
                    ev = r[e]
                    r[o] = np.where(c if t.ndim == 1 else c[:, None], t, ev)
        return f_if

    def _for(self, op: ir.Op, ins, outs):
        body, term = self.region(op.regions[0])
        lb, ub, st = ins[:3]
        inits = ins[3:]
        args = [self.slot(v) for v in op.regions[0].args]
        iv_slot, iter_slots = args[0], args[1:]
        backedge = not _yields(body)

        def f_for(r, m, ctx):
            iv, up, step = r[lb], r[ub], r[st]
            iters = [r[s] for s in inits]
            active = iv < up
            if m is not None:
                active &= m
            while active.any():
                am = None if active.all() else active
                r[iv_slot] = iv
                for s, v in zip(iter_slots, iters):
                    r[s] = v
                yield from run(body, r, am, ctx)
                if am is None:
                    iters = [r[s] for s in term]
                else:
                    iters = [np.where(am if n.ndim == 1 else am[:, None], r[s], n)
                             for s, n in zip(term, iters)]
                iv = iv + step
                active = active & (iv < up)
                if backedge:
                    yield op
            for o, v in zip(outs, iters):
                r[o] = v
        return f_for

    def _while(self, op: ir.Op, ins, outs):
        before, cterm = self.region(op.regions[0])
        after, aterm = self.region(op.regions[1])
        bargs = [self.slot(v) for v in op.regions[0].args]
        aargs = [self.slot(v) for v in op.regions[1].args]
        cond, fwd = cterm[0], cterm[1:]
        backedge = not (_yields(before) or _yields(after))

        def f_while(r, m, ctx):
            cur = [r[s] for s in ins]
            active = m
            res = None
            ctx.spinning.append((op, self))
            try:
                while True:
                    for s, v in zip(bargs, cur):
                        r[s] = v
                    yield from run(before, r, active, ctx)
                    c = r[cond]
                    vals = [r[s] for s in fwd]
                    if res is None:
                        res = vals
                    else:
                        ex = ~c if active is None else (active & ~c)
                        res = [np.where(ex if v.ndim == 1 else ex[:, None], v, o)
                               for v, o in zip(vals, res)]
                    cont = c if active is None else (active & c)
                    if not cont.any():
                        break
                    cont = None if cont.all() else cont
                    for s, v in zip(aargs, vals):
                        r[s] = v
                    yield from run(after, r, cont, ctx)
                    cur = [r[s] for s in aterm]
                    active = cont
                    if backedge:
                        yield op
            finally:
                ctx.spinning.pop()
            for o, v in zip(outs, res):
                r[o] = v
        return f_while


def _yields(code: Code) -> bool:
    return any(kind == 2 for _, kind in code)


def run(code: Code, r: list, m: np.ndarray | None, ctx: Any) -> Iterator:
    for fn, kind in code:
        if kind == 0:
            fn(r)
        elif kind == 1:
            fn(r, m, ctx)
        else:
            yield from fn(r, m, ctx)


# ----------------------------------------------------------------------------- memory

_ARANGE: dict[int, np.ndarray] = {}


def _lanes(m, lanes: int) -> np.ndarray:
    """Indices of the active lanes."""
    if m is not None:
        return np.flatnonzero(m)
    a = _ARANGE.get(lanes)
    if a is None:
        a = _ARANGE[lanes] = np.arange(lanes)
    return a


def _waves(m, lanes: int, ctx: Any) -> list | None:
    """The waves with an active lane (None: every wave)."""
    if m is None:
        return None
    return np.unique(np.flatnonzero(m) // ctx.wave).tolist()


def _scatter(m, vals, lanes: int, dt, count: int):
    if m is None:
        return vals
    full = np.zeros((lanes,) if count == 0 else (lanes, count), dt)
    full[m] = vals
    return full


_ATOMIC_FNS: dict[str, Callable] = {
    "add": lambda o, v: o + v,
    "max": np.maximum,
    "xchg": lambda o, v: v.copy(),
}


def _atomic_fn(kind: str, dt: np.dtype) -> Callable:
    if kind == "umax":
        u = nx.UNSIGNED[dt.itemsize * 8]
        return lambda o, v: np.maximum(o.view(u), v.view(u)).view(dt)
    return _ATOMIC_FNS[kind]


def _memory_op(op: ir.Op, ins, outs, lanes: int):
    name = op.name
    scope, order = op.attrs.get("scope"), op.attrs.get("order")
    releases = scope in _DRAIN_SCOPES and order in ("release", "acq_rel")
    acquires = scope in _DRAIN_SCOPES and order in ("acquire", "acq_rel")
    # where a release store lands (weak.py): agent -> the device level, system -> memory
    level = (DEVICE if scope == "agent" else MEMORY) if releases else BLOCK
    loc = op.loc or "?"
    if name == "barrier":
        def f_barrier(r, m, ctx):
            if m is not None:
                raise SimError(f"barrier() at {loc} reached by only some threads of the block "
                               "(divergent control flow): a hang or undefined on hardware")
            yield op
            ctx.smem.barrier()
            if global_too:  # a shared_barrier orders shared memory only
                ctx.mem.block_barrier(ctx)  # cumulativity: any wave's later release publishes
        global_too = op.attrs.get("memory", "all") != "shared"
        return f_barrier, 2
    if name == "fence":
        def f_fence(r, m, ctx):
            yield op
            if releases:
                ctx.mem.drain(ctx, scope, _waves(m, lanes, ctx))
            if acquires:
                ctx.acq_time = ctx.sched.now
        return f_fence, 2
    ptype = op.operands[0].type
    shared = ptype.space == "shared"
    p = ins[0]
    if name == "load":
        t = op.result.type
        dt = nx.np_dtype(t)
        count = t.count if isinstance(t, ir.VectorType) else 0
        o = outs[0]
        size = dt.itemsize * max(count, 1)
        if shared:
            def f_sload(r, m, ctx):
                offs = r[p] if m is None else r[p][m]
                ctx.smem.read_check(_lanes(m, lanes), offs, size, loc)
                vals = GlobalMemory._read(ctx.smem.alloc, offs, dt, count)
                r[o] = _scatter(m, vals, lanes, dt, count)
            return f_sload, 1

        plain = scope is None

        def f_load(r, m, ctx):
            yield op
            addrs = r[p] if m is None else r[p][m]
            v = ctx.mem.load(ctx, addrs, dt, count, plain)
            if acquires:
                ctx.acq_time = ctx.sched.now
            ctx.last_load = (op, addrs, v)
            r[o] = _scatter(m, v, lanes, dt, count)
        return f_load, 2
    if name == "store":
        vs = ins[1]
        if shared:
            def f_sstore(r, m, ctx):
                offs = r[p] if m is None else r[p][m]
                v = r[vs] if m is None else r[vs][m]
                data = np.ascontiguousarray(v).view(np.uint8).reshape(len(offs), -1)
                ctx.smem.write_check(_lanes(m, lanes), offs, data.shape[1], loc)
                GlobalMemory._write(ctx.smem.alloc, offs, data)
            return f_sstore, 1

        def f_store(r, m, ctx):
            yield op
            if releases:
                ctx.mem.drain(ctx, scope, _waves(m, lanes, ctx))
            addrs = r[p] if m is None else r[p][m]
            v = r[vs] if m is None else r[vs][m]
            ctx.mem.store(ctx, addrs, v, level, _lanes(m, lanes) // ctx.wave)
        return f_store, 2
    # atomic / cas
    dt = nx.np_dtype(op.result.type)
    o = outs[0]
    fn = _atomic_fn(op.attrs["kind"], dt) if name == "atomic" else None
    val_slot, cmp_slot = (ins[1], None) if name == "atomic" else (ins[2], ins[1])

    def f_atomic(r, m, ctx):
        if not shared:
            yield op
            if releases:
                ctx.mem.drain(ctx, scope, _waves(m, lanes, ctx))
        addrs = r[p] if m is None else r[p][m]
        v = r[val_slot] if m is None else r[val_slot][m]
        c = None if cmp_slot is None else (r[cmp_slot] if m is None else r[cmp_slot][m])
        if shared:
            ctx.smem._bytes(_lanes(m, lanes), addrs, dt.itemsize, "atomic")  # bounds
            old = apply_atomic(ctx.smem.alloc.view(dt), addrs // dt.itemsize, fn, v, c)
        else:
            old = ctx.mem.atomic(ctx, addrs, fn, v, dt, c)
            if acquires:
                ctx.acq_time = ctx.sched.now
        r[o] = _scatter(m, old, lanes, dt, 0)
    return f_atomic, 2
