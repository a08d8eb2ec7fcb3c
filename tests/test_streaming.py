"""dsl.streaming: pointers whose `[i]` reads and writes are nontemporal. The same values on
every consumer; sm_90 writes 16-byte packs as ld/st.global.cs (LLVM's NVPTX backend drops
the nontemporal flag), AMD targets set the nt bit; the shipped split fused path uses it."""
from __future__ import annotations

import re

import pytest
import torch

import peerdsl
import peerdsl.dsl as dsl
from sim_kernels import run1


@dsl.kernel(block_size=64)
def k_stream_copy(src: dsl.Ptr[dsl.bf16], dst: dsl.Ptr[dsl.bf16], packs: dsl.i32):
    i = dsl.thread_id()
    s = (dsl.streaming(src) + 8).cast(dsl.bf16x8)   # offset then cast: the flag follows both
    d = dsl.streaming(dst).cast(dsl.bf16x8)
    if i < packs:  # a guarded streamed load must stay under its branch (past the end: no read)
        d[i] = s[i]
    if i == 0:
        dst[0] = src[3]  # a plain 2-byte access beside them


def test_streaming_copy_values_on_the_simulator():
    # src ends at the 40 packs read: a thread past them that read anyway would fault
    src = torch.arange(40 * 8 + 8, dtype=torch.float32).to(torch.bfloat16)
    out = run1(k_stream_copy.trace(), {"packs": 40}, {"src": src},
               {"dst": ((64 * 8,), torch.bfloat16)})["dst"]
    want = torch.zeros(64 * 8, dtype=torch.bfloat16)
    want[:40 * 8] = src[8:8 + 40 * 8]
    want[0] = src[3]
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_streaming_lowers_to_cache_streaming_ptx_and_amd_nt():
    ptx = peerdsl.compile(k_stream_copy, "sm_90").isa
    assert re.search(r"ld\.global\.cs\.v4\.b32", ptx) and re.search(r"st\.global\.cs\.v4\.b32", ptx)
    # the load sits inside the bounds test: a predicated branch jumps over it (the asm has
    # side effects, so LLVM does not hoist it out), or the load itself is predicated
    lines = ptx.splitlines()
    load = next(i for i, line in enumerate(lines) if "ld.global.cs" in line)
    guarded = re.search(r"@!?%p\d+ ld\.global\.cs", lines[load])
    for i in range(load):
        jump = re.search(r"@!?%p\d+ bra(?:\.uni)? \s*(\$\w+);", lines[i])
        if jump and any(line.startswith(jump.group(1) + ":") for line in lines[load + 1:]):
            guarded = True
    assert guarded, ptx
    assert re.search(r"st\.global\.b16", ptx)  # the plain scalar store is unchanged
    isa = peerdsl.compile(k_stream_copy, "gfx1250").isa
    assert re.search(r"global_load_b128 .*TH_LOAD_NT", isa)
    assert re.search(r"global_store_b128 .*TH_STORE_NT", isa)


def test_streaming_needs_a_pointer():
    @dsl.kernel(block_size=64)
    def bad(n: dsl.i32):
        dsl.streaming(n)

    with pytest.raises(dsl.TraceError, match="dsl.streaming takes a pointer, got i32"):
        bad.trace()


def test_split_fused_path_streams_its_once_read_data_on_sm90():
    """Stage 1 alone (S = 1) reads the inputs streamed, every rank's pack of each of its U
    shard packs; the gather kernel reads the residual and writes residual_out so, one pack
    per slot of a thread's row: the reduced shards every rank reads stay in L2 (calls R3,
    R4). out is not streamed (the next kernel reads it), nor is the one-launch kernel (S = 0,
    the form AMD targets build)."""
    from peerdsl.lowering.targets import get_target
    from peerdsl.ops.registry import load_all
    ops, t = load_all(), get_target("sm_90")

    def ptx(op, **where):
        variant = next(v for v in ops[op].variants(t)
                       if all(v.get(k) == want for k, want in where.items()))
        return peerdsl.compile(ops[op].kernel, "sm_90", **variant).isa

    def count(pattern, text):
        return len(re.findall(pattern, text))

    stage1 = ptx("fused_ar_rms_2stage", S=1, U=4, H=2880, W=4, T=dsl.bf16)
    assert count(r"ld\.global\.cs\.v4", stage1) == 4 * 4 and count(r"st\.global\.cs", stage1) == 0
    one_launch = ptx("fused_ar_rms_2stage", S=0, H=2880, W=4, T=dsl.bf16)
    assert count(r"\.global\.cs", one_launch) == 0
    for where, slots in (({"H": 6144}, 3), ({"MAXH": 16384}, 8)):
        op = "fused_ar_rms_gather" + ("_runtime_h" if "MAXH" in where else "")
        gather = ptx(op, W=4, T=dsl.bf16, **where)
        assert count(r"ld\.global\.cs\.v4", gather) == slots        # residual
        assert count(r"st\.global\.cs\.v4", gather) == slots        # residual_out
        assert count(r"st\.global\.v4", gather) == slots             # out, not streamed
