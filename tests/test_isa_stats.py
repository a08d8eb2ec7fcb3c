"""isa_stats: instruction classes from AMD (gfx12 and gfx9 spellings) and PTX listings, and
AMD occupancy checked against what clang-22 itself reports for the same kernels."""
from __future__ import annotations

import itertools
import re
import subprocess

import pytest

from peerdsl import isa_stats as S
from peerdsl import reference_build as rb

GFX12 = """\
	.globl	k
k:                                      ; @k
	s_load_b256 s[4:11], s[0:1], 0x0
	s_wait_kmcnt 0x0
	global_load_b128 v[0:3], v4, s[4:5]
	global_load_b128 v[4:7], v4, s[6:7] scope:SCOPE_SYS
	global_load_b64 v[8:9], v4, s[8:9]
	global_load_b32 v10, v4, s[10:11] th:TH_LOAD_NT scope:SCOPE_SYS
	global_load_u16 v11, v4, s[10:11]
	s_wait_loadcnt 0x0
	global_store_b128 v4, v[0:3], s[4:5]
	global_store_b32 v4, v10, s[4:5] scope:SCOPE_SYS
	global_atomic_add_u32 v12, v4, v13, s[8:9] th:TH_ATOMIC_RETURN scope:SCOPE_SYS
	global_wb scope:SCOPE_SYS
	global_inv scope:SCOPE_SYS
	ds_store_b32 v4, v10
	s_wait_loadcnt_dscnt 0x0
	s_barrier_signal -1
	s_barrier_wait -1
	v_pk_add_bf16 v5, v5, v9
	s_add_co_i32 s4, s4, 1
	s_delay_alu instid0(SALU_CYCLE_1) | instskip(SKIP_2) | instid1(VALU_DEP_1)
	s_cbranch_execz .LBB0_2
; %bb.1:
	s_branch .LBB0_2
.LBB0_2:                                ; comment only
	s_endpgm
.Lfunc_end0:
	.size	k, .Lfunc_end0-k
other:
	global_load_b128 v[0:3], v4, s[4:5]
"""


def test_amd_gfx12_classes_partition_the_instructions():
    c = S.count_amd(S.function_lines(GFX12, "k"))
    assert c["instructions"] == 23  # `other` is not part of k; labels, directives are not
    groups = [g for g in S.AMD_GROUPS]
    assert sum(c[g] for g in groups) == c["instructions"]
    assert c["global loads"] == 5
    assert c["global loads|global_load_b128"] == 2 and c["global loads|global_load_b64"] == 1
    assert c["global loads|global_load_b32"] == 1 and c["global loads|global_load_u16"] == 1
    assert c["global stores|global_store_b128"] == 1 and c["global stores|global_store_b32"] == 1
    assert c["atomics|global_atomic_add_u32"] == 1
    assert c["cache wb/inv|global_wb"] == 1 and c["cache wb/inv|global_inv"] == 1
    assert c["waits"] == 3 and c["waits|s_wait_kmcnt"] == 1 and c["waits|s_wait_loadcnt"] == 1
    assert c["waits|s_wait_loadcnt_dscnt"] == 1
    assert c["barriers|s_barrier_signal"] == 1 and c["barriers|s_barrier_wait"] == 1
    assert c["VALU (v_*)"] == 1 and c["SALU (s_*)"] == 1 and c["branches"] == 2
    assert c["scalar loads|s_load_b256"] == 1 and c["LDS (ds_*)"] == 1
    assert c[S.CONTROL] == 2  # s_delay_alu, s_endpgm


def test_amd_gfx9_spellings_map_to_gfx12_widths_and_waitcnt_kinds():
    text = ("k:\n\tglobal_load_dwordx4 v[0:3], v4, s[4:5] sc0 sc1\n"
            "\tglobal_load_dword v5, v4, s[4:5]\n\tglobal_store_dwordx2 v4, v[0:1], s[4:5]\n"
            "\tglobal_load_ushort v6, v4, s[4:5]\n\ts_waitcnt vmcnt(0) lgkmcnt(0)\n"
            "\ts_waitcnt vmcnt(1)\n\tbuffer_wbl2 sc1\n\tbuffer_inv sc1\n"
            "\tflat_load_dwordx4 v[0:3], v[4:5]\n\ts_barrier\n\ts_endpgm\n.Lfunc_end0:\n")
    c = S.count_amd(S.function_lines(text, "k"))
    assert c["global loads|global_load_b128"] == 1 and c["global loads|global_load_b32"] == 1
    assert c["global loads|global_load_u16"] == 1
    assert c["global stores|global_store_b64"] == 1
    assert c["waits"] == 2 and c["waits|s_waitcnt vmcnt"] == 2
    assert c["waits|s_waitcnt lgkmcnt"] == 1
    assert c["cache wb/inv|buffer_wbl2"] == 1 and c["cache wb/inv|buffer_inv"] == 1
    assert c["other vector memory|flat_load_b128"] == 1 and c["barriers|s_barrier"] == 1


def test_amd_objdump_listing():
    text = ("0000000000001600 <k>:\n"
            "\tglobal_load_b128 v[0:3], v4, s[4:5]                        // 000000001600: EE\n"
            "\ts_endpgm                                                   // 000000001608: BF\n"
            "0000000000001700 <next>:\n\ts_endpgm\n")
    c = S.count_amd(S.function_lines(text, "k"))
    assert c["global loads|global_load_b128"] == 1 and c["instructions"] == 2


PTX = """\
.visible .entry k(
	.param .u64 k_param_0
)
{
	ld.param.u64 	%rd1, [k_param_0];
	ld.global.v4.u32 	{%r1, %r2, %r3, %r4}, [%rd1];
	ld.acquire.sys.b32 %r5,[%rd1];
	ld.volatile.global.v4.b32 {%r1,%r2,%r3,%r4}, [%rd1];
	st.global.v4.u32 	[%rd1], {%r1, %r2, %r3, %r4};
	st.release.sys.b32 	[%rd1], %r5;
	{  cvt.rn.bf16.f32 %rs9, %f35;}
	atom.cas.acq_rel.sys.b32 %r6, [%rd1], 0, 1;
	atom.acq_rel.sys.global.cas.b32 %r6, [%rd1], 0, 1;
	fence.acq_rel.sys;
	ld.shared.f32 %f1, [%r7];
	st.local.u32 [%rd2], %r1;
	bar.sync 	0;
	@%p1 bra 	$L__BB0_2;
$L__BB0_2:
	ret;
}
.visible .entry other(
)
{
	ret;
}
"""


def test_ptx_classes():
    c = S.count_ptx(S.ptx_function(PTX, "k"))
    assert c["instructions"] == 15
    assert sum(c[g] for g in S.PTX_GROUPS) == c["instructions"]
    assert c["global loads|ld.global.b128"] == 2 and c["global loads|ld.global.b32"] == 1
    assert c["global stores|st.global.b128"] == 1 and c["global stores|st.global.b32"] == 1
    # nvcc's and the DSL's modifier orders name the same atomic
    assert c["atomics|atom.cas.acq_rel.sys"] == 2
    assert c["fences|fence.acq_rel.sys"] == 1 and c["barriers|bar.sync"] == 1
    assert c["param loads"] == 1 and c["shared ld/st"] == 1 and c["local ld/st"] == 1
    assert c["branches"] == 2
    assert S.kernel_names(PTX) == ["k", "other"]


def test_merged_rows_put_children_under_their_group():
    a = {"instructions": 3, "waits": 2, "waits|s_wait_loadcnt": 2, "barriers": 1}
    b = {"instructions": 3, "waits": 2, "waits|s_wait_kmcnt": 1, "waits|s_wait_dscnt": 1,
         "barriers": 0}
    rows = S.merged_rows(a, b)
    assert rows == ["instructions", "waits", "waits|s_wait_dscnt", "waits|s_wait_kmcnt",
                    "waits|s_wait_loadcnt", "barriers"]
    assert S.row_label("waits|s_wait_kmcnt") == "  s_wait_kmcnt"
    with pytest.raises(KeyError, match="kernels there"):
        S.function_lines(GFX12, "missing")


# ----------------------------------------------------------------------------- occupancy
def _kernels(arch: str) -> list[tuple[str, int, int, int, int]]:
    """(name, vgprs, sgprs, lds bytes, block) covering each limit: VGPRs, SGPRs (gfx9),
    LDS, single-wave groups. Register counts forced with inline-asm clobbers."""
    lds_sizes = {"gfx1250": [0, 5000, 40000, 150000], "gfx942": [0, 3000, 9000, 40000],
                 "gfx950": [0, 5000, 40000, 150000]}[arch]
    out = []
    for vg, sg, lds, block in itertools.product([8, 72, 130, 256], [20, 89, 101], lds_sizes,
                                                [64, 256, 1024]):
        if arch != "gfx1250" and -(-vg // 4) * 4 > 512 // max(1, -(-block // 256)):
            continue  # more registers than a gfx9 group of that size may have
        out.append((f"k{len(out)}", vg, sg, lds, block))
    return out


@pytest.mark.parametrize("arch", ["gfx1250", "gfx942", "gfx950"])
def test_occupancy_matches_clang(arch, tmp_path):
    if rb.find_clang() is None:
        pytest.skip(rb.missing_reason(arch))
    cases = _kernels(arch)
    src = ['#include "hip_min.h"']
    for name, vg, sg, lds, block in cases:
        body = (f"__shared__ float sh[{lds // 4}]; sh[ref_thread_id()] = 1.f; __syncthreads(); "
                "p[ref_thread_id()] = sh[ref_thread_id() ^ 1];" if lds else "p[0] = 1.f;")
        src.append(f'extern "C" __global__ REF_LAUNCH_BOUNDS({block}) void {name}(float* p) '
                   f'{{ asm volatile("" ::: "v{vg - 1}", "s{sg - 1}"); {body} }}')
    (tmp_path / "k.hip").write_text("\n".join(src) + "\n")
    out = tmp_path / "k.s"
    subprocess.run([rb.find_clang(), *rb.CLANG_FLAGS, f"--offload-arch={arch}",
                    f"-I{rb.INCLUDE_DIR}", "-S", str(tmp_path / "k.hip"), "-o", str(out)],
                   check=True, capture_output=True)
    text = out.read_text()
    blocks = {n: b for n, _, _, _, b in cases}
    seen = 0
    for m in re.finditer(r"^(k\d+):.*?; Kernel info:(.*?); Occupancy: (\d+)", text, re.S | re.M):
        info = m.group(2)
        vg = int(re.search(r"NumVGPRsForWavesPerEU: (\d+)", info).group(1))
        sg = int(re.search(r"NumSGPRsForWavesPerEU: (\d+)", info).group(1))
        lds = int(re.search(r"LDSByteSize: (\d+)", info).group(1))
        wave = 32 if arch == "gfx1250" else 64
        got = S.amd_occupancy(arch, vg, sg, lds, blocks[m.group(1)], wave)
        assert got == int(m.group(3)), (arch, m.group(1), vg, sg, lds, blocks[m.group(1)])
        seen += 1
    assert seen == len(cases)
