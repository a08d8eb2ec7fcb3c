"""`RegisteredPtrs`: peer pointers read at kernel entry from a device-side table. The loads
are placed at the top of the body whatever control flow first uses them, so they dominate
every use; the simulator runs the same IR that lowering compiles (with llvm.inttoptr)."""
from __future__ import annotations

import torch

import peerdsl.sim
from peerdsl import dsl, layout
from peerdsl.dsl import Ptr, RegisteredPtrs, constexpr
from peerdsl.lowering import mlir_gen


def _first_use_in_branch(inp, out, W):
    if dsl.thread_id() == 0:
        out[W] = inp[1][1]  # a constant index, first used inside a traced branch


@dsl.kernel(block_size=32)
def gather_heads(inp: RegisteredPtrs[dsl.i32], other: RegisteredPtrs[dsl.i32],
                 out: Ptr[dsl.i32], W: constexpr):
    t = dsl.thread_id()
    if t < W:
        out[t] = inp[t][0]  # a traced index: loaded where it is used
    _first_use_in_branch(inp, out, W)
    i = 0
    while other[0][i] != 0:  # first use of the second table inside a while condition
        i = i + 1
    if t == 0:
        out[W + 1] = i


def test_entry_loads_dominate_every_use():
    k = gather_heads.trace(W=2)
    top = [op.name for op in k.body.ops[:8]]
    assert top.count("int_to_ptr") == 2  # inp[1] and other[0], spliced at the top
    defined = set(p.value.id for p in k.params)

    def check(block, seen):
        seen = set(seen) | {a.id for a in block.args}
        for op in block.ops:
            assert all(v.id in seen for v in op.operands), f"{op.name} uses an undefined value"
            for region in op.regions:
                check(region, seen)
            seen |= {r.id for r in op.results}
    check(k.body, defined)
    for arch in ("gfx1250", "sm_90"):
        text, _ = mlir_gen.generate(k, arch, "g")
        assert text.count("llvm.inttoptr") >= 3  # two entry loads, one at the traced index


def test_simulated_ranks_read_peers_through_the_table():
    def fn(comm):
        mine = comm.to_device(torch.tensor([10 * comm.rank + j for j in range(4)],
                                           dtype=torch.int32))
        zeros = comm.to_device(torch.tensor([1, 1, 1, 0], dtype=torch.int32))
        tables = []
        for buf in (mine, zeros):
            peers = layout.peer_row(comm.register(buf))
            tables.append(comm.to_device(torch.tensor(peers, dtype=torch.int64)))
        out = comm.alloc((comm.world + 2,), torch.int32)
        comm.launch_ir(gather_heads, {"W": comm.world}, 1,
                    {"inp": tables[0].addr, "other": tables[1].addr, "out": out})
        return comm.to_torch(out).tolist()
    for got in peerdsl.sim.run(2, fn, seed=3):
        assert got == [0, 10, 11, 3]
