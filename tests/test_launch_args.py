"""The launch-argument checker (runtime/launch_args.py) on its own: signatures from a manifest
entry (with and without the build's annotations) and from a DSL kernel, the alignment found
in the IR, and the value rules shared by the GPU and the simulator."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from peerdsl import dsl
from peerdsl.dsl import PeerPtrs, Ptr, RegisteredPtrs, constexpr
from peerdsl.runtime.kernarg import arg_specs_from_json
from peerdsl.runtime.launch_args import (LaunchArgError, Param, Signature, annotate_args,
                                         check_args, check_grid, pointer_alignment,
                                         signature_from_entry, signature_from_kernel)
from peerdsl.runtime.peer_buffers import PeerBuffer
from peerdsl.runtime.manifest import KernelEntry

CPU = torch.device("cpu")


@dsl.kernel(block_size=64)
def mixed(inp: RegisteredPtrs["T"], peers: PeerPtrs["T"], out: Ptr["T"], idx: Ptr[dsl.i32],
          rank: dsl.i32, n: dsl.i32, T: constexpr):
    """Packs through a loop-carried pointer and a dynamically selected peer; plain i32s."""
    P = dsl.vec16(T)
    p = out.cast(P)
    i = dsl.thread_id()
    while i < n:
        p[i] = inp[rank].cast(P)[i]
        i = i + 64
    j = dsl.load(idx + rank)
    dsl.store(peers[rank].cast(P) + j, inp[0].cast(P)[j], "system", "relaxed")


def entry_of(args, op="mixed", constexprs=None):
    specs = arg_specs_from_json(args)
    size = max(a.offset + a.size for a in specs)
    return KernelEntry(name=op + "_0123456789", op=op, symbol=op, path=None, sha256="",
                       constexprs=constexprs or {"T": "bf16"}, block_size=64, lds_bytes=0,
                       dynamic_lds_bytes=0, args=specs, kernarg_size=size, resources={},
                       cache_key="", raw={})


def layout_of(traced):
    off, out = 0, []
    for p in traced.params:
        size = 8 if isinstance(p.type, dsl.ir.PtrType) else p.type.nbytes
        off = (off + size - 1) // size * size
        t = f"ptr<{p.type.elem}>" if isinstance(p.type, dsl.ir.PtrType) else p.type.name
        out.append({"name": p.name, "type": t, "offset": off, "size": size})
        off += size
    return out


def test_alignment_follows_casts_loops_selects_and_tables():
    traced = mixed.trace(T="bf16")
    direct, via_table = pointer_alignment(traced)
    assert direct["out"] == 16                       # through the while loop's carried value
    assert {direct[f"peers_{i}"] for i in range(8)} == {16}   # ptr_select of the table
    assert direct["idx"] == 4 and direct["inp"] == 8          # i32 words; the table's i64s
    assert via_table == {"inp": 16}                  # the pointers read from the table


def test_kernel_and_annotated_entry_give_the_same_signature():
    traced = mixed.trace(T=dsl.bf16)
    sig = signature_from_kernel(mixed, traced)
    assert sig.kernel == "mixed[T=bf16]" and sig.synchronizes
    assert [(p.name, p.declared, p.align, p.peers) for p in sig.params] == [
        ("inp", "RegisteredPtrs[bf16]", 16, 0), ("peers", "PeerPtrs[bf16]", 16, 8),
        ("out", "Ptr[bf16]", 16, 0), ("idx", "Ptr[i32]", 4, 0), ("rank", "i32", 1, 0),
        ("n", "i32", 1, 0)]
    from_entry = signature_from_entry(entry_of(annotate_args(layout_of(traced), mixed, traced)))
    assert from_entry == sig


def test_an_unannotated_manifest_is_checked_conservatively():
    traced = mixed.trace(T="bf16")
    plain = entry_of(layout_of(traced))               # an old build: no role, no align
    sig = signature_from_entry(plain)
    kinds = {p.name: (p.kind, p.declared, p.align) for p in sig.params}
    assert kinds["inp"] == ("ptr", "Ptr[i64]", 16)    # a table is indistinguishable
    assert kinds["idx"] == ("ptr", "Ptr[i32]", 16)    # 16 for every pointer
    assert kinds["peers"] == ("peer_ptrs", "PeerPtrs[bf16]", 16)
    with_kernel = {p.name: p.declared for p in signature_from_entry(plain, mixed).params}
    assert with_kernel["inp"] == "RegisteredPtrs[bf16]"   # roles from the DSL kernel


def sig(*params):
    return Signature("k", tuple(params))


def test_scalar_rules():
    s = sig(Param("n", "scalar", "i32"), Param("big", "scalar", "i64"),
            Param("x", "scalar", "f32"))
    ok = check_args(s, {"n": np.int32(7), "big": -2**63, "x": 3}, {}, device=CPU)
    assert ok == {"n": 7, "big": -2**63, "x": 3.0} and isinstance(ok["x"], float)
    for bad, pattern in [({"n": 1.0}, r"'n' got float 1\.0; the kernel declares i32: i32 needs "
                                      r"an int \(int\(1\.0\) truncates\)"),
                         ({"n": np.bool_(True)}, r"'n'.*bool is not a i32"),
                         ({"big": 2**63}, r"'big'.*out of range for i64"),
                         ({"x": True}, r"'x' got bool True; the kernel declares f32"),
                         ({"x": np.float64(1e39)}, r"'x'.*overflows f32"),
                         ({"x": [1.0]}, r"'x'.*f32 needs a number")]:
        with pytest.raises(LaunchArgError, match=pattern):
            check_args(s, {"n": 1, "big": 1, "x": 1.0, **bad}, {}, device=CPU)
    assert check_args(s, {"n": 1, "big": 1, "x": float("inf")}, {}, device=CPU)["x"] == \
        float("inf")


def test_pointer_rules_and_peer_buffers():
    s = sig(Param("p", "ptr", "bf16", 1, 16), Param("t", "peer_ptrs", "i32", 1, 4, 8),
            Param("r", "registered_ptrs", "bf16", 1, 16))
    t = PeerBuffer([4096, 8192], 0, torch.int32, (16,))
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert check_args(s, {"p": None, "t": [4096], "r": 64}, {}, device=CPU)["p"] is None
    assert check_args(s, {"p": 32, "t": t, "r": x}, {}, device=CPU)["t"] is t
    for bad, pattern in [({"p": 40}, r"'p' got int 40.*address 0x28, not 16-byte aligned"),
                         ({"p": -16}, r"'p'.*not a 64-bit address"),
                         ({"p": 16.0}, r"'p'.*not an address"),
                         ({"p": "0x10"}, r"'p'.*expected a tensor, a PeerBuffer or an int"),
                         ({"t": [4096, 4098]}, r"'t'.*0x1002, not 4-byte aligned"),
                         ({"t": [4096] * 9}, r"'t'.*1\.\.8 addresses, got 9"),
                         ({"t": PeerBuffer([0], 0, torch.float32, (1,))},
                          r"'t'.*dtype float32 is not the declared element i32"),
                         ({"r": 12}, r"'r'.*table address must be 8-byte aligned"),
                         ({"r": [1, 2]}, r"'r'.*RegisteredPtrs takes one buffer"),
                         ({"r": x[1:]}, r"'r'.*its data starts at 0x[0-9a-f]+, not 16-byte")]:
        with pytest.raises(LaunchArgError, match=pattern):
            check_args(s, {"p": 32, "t": t, "r": x, **bad}, {}, device=CPU)


def test_runtime_filled_parameters_are_the_hooks_job():
    s = sig(Param("n", "scalar", "i32"), Param("call", "call_id", "i32"))
    with pytest.raises(LaunchArgError, match=r"\['call'\] are filled by the runtime: do not "
                       r"pass them \(the kernel takes n: i32\)"):
        check_args(s, {"n": 1, "call": 5}, {}, device=CPU)
    with pytest.raises(LaunchArgError, match=r"'call' is filled by the runtime, which gave no"):
        check_args(s, {"n": 1}, {}, device=CPU)
    assert check_args(s, {"n": 1}, {"call": 9}, device=CPU) == {"n": 1, "call": 9}
    roles = entry_of([{"name": "n", "type": "i32", "offset": 0, "size": 4},
                      {"name": "call", "type": "i32", "offset": 4, "size": 4,
                       "role": "call_id"}])
    assert signature_from_entry(roles).runtime_filled == ["call"]


def test_grid_rules():
    sync = sig(Param("t", "peer_ptrs", "i32", 1, 4, 8))
    local = sig(Param("n", "scalar", "i32"))
    assert check_grid(sync, np.int64(8), 8) == 8 and check_grid(local, 10**6, 8) == 10**6
    for grid, pattern in [(9, "grid 9 exceeds 8"), (0, r"grid 0 is not in \[1, 2\^31\)"),
                          (2.0, "grid must be a positive int, got float"),
                          (True, "grid must be a positive int, got bool"),
                          ((1, 2), "one-dimensional")]:
        with pytest.raises(LaunchArgError, match=pattern):
            check_grid(sync, grid, 8)
