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
    src = torch.arange(64 * 8 + 8, dtype=torch.float32).to(torch.bfloat16)
    out = run1(k_stream_copy.trace(), {"packs": 40}, {"src": src},
               {"dst": ((64 * 8,), torch.bfloat16)})["dst"]
    want = torch.zeros(64 * 8, dtype=torch.bfloat16)
    want[:40 * 8] = src[8:8 + 40 * 8]
    want[0] = src[3]
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_streaming_lowers_to_cache_streaming_ptx_and_amd_nt():
    ptx = peerdsl.compile(k_stream_copy, "sm_90").isa
    assert re.search(r"ld\.global\.cs\.v4\.b32", ptx) and re.search(r"st\.global\.cs\.v4\.b32", ptx)
    # the load sits behind the bounds test: a branch or a predicate guards it
    load_line = next(i for i, line in enumerate(ptx.splitlines()) if "ld.global.cs" in line)
    before = "\n".join(ptx.splitlines()[:load_line + 1])
    assert re.search(r"@%p\d+ bra|@!?%p\d+ ld\.global\.cs", before)
    assert re.search(r"st\.global\.b16", ptx)  # the plain scalar store is unchanged
    isa = peerdsl.compile(k_stream_copy, "gfx1250").isa
    assert re.search(r"global_load_b128 .*TH_LOAD_NT", isa)
    assert re.search(r"global_store_b128 .*TH_STORE_NT", isa)


def test_streaming_needs_a_pointer():
    @dsl.kernel(block_size=64)
    def bad(n: dsl.i32):
        dsl.streaming(n)

    with pytest.raises(dsl.TraceError, match="dsl.streaming takes a pointer"):
        bad.trace()


def test_split_fused_path_streams_its_once_read_data_on_sm90():
    """Stage 1 alone reads the inputs streamed, the gather kernel the residual (and writes
    residual_out so): the reduced shards every rank reads stay in L2 (call R3/R4). out is
    not streamed: the next kernel reads it."""
    from peerdsl.lowering.targets import get_target
    from peerdsl.ops.registry import load_all
    ops, t = load_all(), get_target("sm_90")
    stage1 = next(v for v in ops["fused_ar_rms_2stage"].variants(t)
                  if v.get("S") == 1 and v["H"] == 2880 and v["W"] == 4)
    ptx = peerdsl.compile(ops["fused_ar_rms_2stage"].kernel, "sm_90", **stage1).isa
    assert len(re.findall(r"ld\.global\.cs\.v4", ptx)) >= 4  # each rank's input pack
    gather = next(v for v in ops["fused_ar_rms_gather"].variants(t)
                  if v["H"] == 2880 and v["W"] == 4)
    ptx = peerdsl.compile(ops["fused_ar_rms_gather"].kernel, "sm_90", **gather).isa
    assert re.search(r"ld\.global\.cs\.v4", ptx) and re.search(r"st\.global\.cs\.v4", ptx)
    assert re.search(r"st\.global\.v4", ptx)  # out
