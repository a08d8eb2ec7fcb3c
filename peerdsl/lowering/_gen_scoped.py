"""MLIR text for the accesses that decide where a kernel waits: scoped 16-byte packs and
block barriers. A mixin of `_gen_ops.OpsMixin` (which provides emit/val/use/bind/check).

Scoped 16-byte packs. LLVM has no 128-bit atomics on these targets, so the portable lowering
is a volatile 16-byte access: one instruction with the scope's cache bits, but on gfx12 the
memory legalizer also waits for every volatile access to complete (`s_wait_storecnt 0` after
each LL store, `s_wait_loadcnt 0` after each load, so a thread's loads of several peers'
lines are serialized). Where the target has them (`Target.scoped_vector_av`), the pack goes
through `llvm.amdgcn.av.{load,store}.b128` with the scope as metadata instead: the same one
instruction with the same scope bits (`global_store_b128 ... scope:SCOPE_SYS`), and no wait
after it. The LL protocol needs exactly that: the 16 bytes land together, at system scope.

Polls stay volatile. An av load is an ordinary memory read to LLVM: in a loop without
stores LICM hoists it and the spin never sees the peer's line (checked on gfx1250). A spin
in the DSL is a `while`, so a scoped pack load anywhere inside a `while` region is volatile;
everywhere else (the first read of a line, grid-stride `for` loops) it is an av load.

Block barriers. `barrier` orders all memory of the workgroup: a workgroup release/acquire
fence pair around s_barrier, which on gfx1250 waits for every outstanding global load and
store (`s_wait_storecnt 0`, `s_wait_loadcnt 0`) at each barrier. A barrier with
memory="shared" (dsl.shared_barrier, used by the block reductions) fences only workgroup
(LDS) memory: `gpu.barrier memfence [#gpu.address_space<workgroup>]`, which is s_wait_dscnt
plus s_barrier_signal / s_barrier_wait and leaves global accesses in flight.
"""
from __future__ import annotations

from typing import Any

from ..dsl import ir

_AV_TYPE = "vector<4xi32>"  # the intrinsics' operand type; other 16-byte packs bitcast


class ScopedMixin:
    poll_depth = 0  # > 0 while op_while emits its regions (where a poll may spin)

    def av_pack(self, op: ir.Op, vt: Any) -> bool:
        """Whether this scoped access of `vt` goes through the av intrinsics (see above)."""
        return (self.t.scoped_vector_av and isinstance(vt, ir.VectorType) and vt.nbytes == 16
                and op.attrs.get("scope") is not None and not op.attrs.get("nontemporal")
                and not (op.name == "load" and self.poll_depth > 0))

    def _av_scope(self, scope: str) -> str:
        name = self.t.syncscope(scope)
        return self.val(f'llvm.mlir.metadata_as_value #llvm.md_node<#llvm.md_string<"{name}">>')

    def _av_cast(self, x: str, src: str, dst: str) -> str:
        return x if src == dst else self.val(f"llvm.bitcast {x} : {src} to {dst}")

    def av_load(self, op: ir.Op, ptr_t: str, vt: str) -> None:
        md = self._av_scope(op.attrs["scope"])
        raw = self.val(f'llvm.call_intrinsic "llvm.amdgcn.av.load.b128"({self.use(op.operands[0])}, '
                       f"{md}) : ({ptr_t}, !llvm.metadata) -> {_AV_TYPE}")
        self.names[op.result.id] = self._av_cast(raw, _AV_TYPE, vt)

    def av_store(self, op: ir.Op, ptr_t: str, vt: str) -> None:
        p, v = op.operands
        md = self._av_scope(op.attrs["scope"])
        data = self._av_cast(self.use(v), vt, _AV_TYPE)
        self.emit(f'llvm.call_intrinsic "llvm.amdgcn.av.store.b128"({self.use(p)}, {data}, {md}) '
                  f": ({ptr_t}, {_AV_TYPE}, !llvm.metadata) -> ()")

    def op_barrier(self, op: ir.Op) -> None:
        memory = op.attrs.get("memory", "all")
        self.check(memory in ("all", "shared"), f"barrier memory {memory!r}")
        if memory == "shared" and self.t.is_amd:
            self.emit("gpu.barrier memfence [#gpu.address_space<workgroup>]")
        else:  # PTX bar.sync orders all memory of the CTA either way
            self.emit("gpu.barrier")
