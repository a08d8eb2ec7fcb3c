"""MLIR text for nontemporal 16-byte packs on NVIDIA targets (`dsl.streaming`). A mixin of
`_gen_ops.OpsMixin` (which provides emit/val/use/bind).

LLVM's NVPTX backend drops the `nontemporal` flag of a load or store (plain
`ld.global.v4.b32`), so a plain 16-byte pack marked nontemporal is written as PTX's
cache-streaming access instead, `ld.global.cs` / `st.global.cs`: the line is allocated with
evict-first priority in L1 and L2, so data read or written once leaves room for data that
is read again (the peers' reduced shards of the split fused path, read by every rank).
The asm has side effects: LLVM must neither hoist a load out of the branch that guards it
(a slot past the row would read out of bounds) nor move it across the stores that may
alias it. AMD targets lower the flag themselves (the `nt` bit).
"""
from __future__ import annotations

from typing import Any

from ..dsl import ir

_LANES = "!llvm.struct<(i32, i32, i32, i32)>"


class StreamingMixin:
    def nv_streaming(self, op: ir.Op, vt: Any, ptr: ir.Value) -> bool:
        """Whether this access is a plain nontemporal 16-byte global pack on NVIDIA."""
        return (self.t.is_nvidia and bool(op.attrs.get("nontemporal"))
                and op.attrs.get("scope") is None and isinstance(vt, ir.VectorType)
                and vt.nbytes == 16 and ptr.type.space != "shared")

    def _address(self, ptr: ir.Value, ptr_t: str) -> str:
        return self.val(f"llvm.ptrtoint {self.use(ptr)} : {ptr_t} to i64")

    def streaming_load(self, op: ir.Op, ptr_t: str, vt: str) -> None:
        addr = self._address(op.operands[0], ptr_t)
        lanes = self.val('llvm.inline_asm has_side_effects "ld.global.cs.v4.b32 '
                         '{$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l" '
                         f"{addr} : (i64) -> {_LANES}")
        vec = self.val("llvm.mlir.undef : vector<4xi32>")
        for i in range(4):
            lane = self.val(f"llvm.extractvalue {lanes}[{i}] : {_LANES}")
            vec = self.val(f"llvm.insertelement {lane}, {vec}[{self.const(i)} : i32] : "
                           "vector<4xi32>")
        self.names[op.result.id] = self.val(f"llvm.bitcast {vec} : vector<4xi32> to {vt}")

    def streaming_store(self, op: ir.Op, ptr_t: str, vt: str) -> None:
        p, v = op.operands
        addr = self._address(p, ptr_t)
        vec = self.val(f"llvm.bitcast {self.use(v)} : {vt} to vector<4xi32>")
        lanes = [self.val(f"llvm.extractelement {vec}[{self.const(i)} : i32] : vector<4xi32>")
                 for i in range(4)]
        self.emit('llvm.inline_asm has_side_effects "st.global.cs.v4.b32 [$0], '
                  '{$1, $2, $3, $4};", "l,r,r,r,r" '
                  f"{addr}, {', '.join(lanes)} : (i64, i32, i32, i32, i32) -> ()")
