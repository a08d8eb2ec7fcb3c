"""Occupancy of a compiled kernel: how many of its waves one SIMD (AMD) holds at once.

Pure arithmetic on the code object's own resource counts (`codeobject.read_amd`), the
kernel's block size and its static LDS, with the per-arch facts below. It mirrors LLVM's
AMDGPU occupancy estimate (the "; Occupancy:" figure `llc` prints), so a DSL kernel and a HIP
kernel compiled by clang are compared on the same terms; tests/test_compile_api.py checks
it against llc-22 on kernels made to hit each limit.

    waves_per_simd = min(by_vgpr, by_sgpr, by_workgroups)

    by_vgpr       = min(max_waves, vgprs_per_simd // roundup(vgpr_count, vgpr_granule))
                    (vgpr_count is the code object's .vgpr_count: on gfx950/gfx942 it already
                    counts the AGPRs, VGPRs and AGPRs sharing one 512-entry file)
    by_sgpr       = min(max_waves, sgprs_per_simd // sgpr_count)   (gfx9 only: 800 SGPRs per
                    SIMD; on gfx1250 SGPRs never limit occupancy)
    waves_per_wg  = ceil(block_size / wave_size)
    wgs_per_cu    = max_waves * simds_per_cu  if waves_per_wg == 1 (no barrier needed), else
                    min(max_waves * simds_per_cu // waves_per_wg, 16 barriers per CU);
                    with LDS: min(that, lds_per_cu // lds_bytes)  (0: the block does not fit)
    by_workgroups = clamp(ceil(wgs_per_cu * waves_per_wg / simds_per_cu), 1, max_waves)
                    (waves spread evenly over the SIMDs: the fullest SIMD, as LLVM reports)

Facts: gfx1250 (wave32): 16 waves per SIMD, 1024 VGPRs per SIMD lane in granules of 16,
4 SIMDs per work-group processor, 320 KiB LDS. gfx950 and gfx942 (wave64): 8 waves per SIMD,
512 VGPRs+AGPRs per SIMD lane in granules of 8, 800 SGPRs per SIMD, 4 SIMDs per CU, LDS
160 KiB (gfx950) and 64 KiB (gfx942).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .targets import Target


@dataclasses.dataclass(frozen=True)
class AmdFacts:
    max_waves_per_simd: int
    simds_per_cu: int
    vgprs_per_simd: int          # per lane; the file every resident wave's VGPRs come from
    vgpr_granule: int
    sgprs_per_simd: int | None   # None: SGPRs do not limit occupancy
    lds_per_cu: int              # bytes
    barriers_per_cu: int = 16    # concurrent multi-wave workgroups


AMD_FACTS: dict[str, AmdFacts] = {
    "gfx1250": AmdFacts(16, 4, 1024, 16, None, 320 * 1024),
    "gfx950": AmdFacts(8, 4, 512, 8, 800, 160 * 1024),
    "gfx942": AmdFacts(8, 4, 512, 8, 800, 64 * 1024),
}


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def amd_occupancy(arch: str, wave_size: int, block_size: int, vgpr: int, sgpr: int,
                  lds_bytes: int) -> tuple[int, str]:
    """(waves per SIMD, what limits it: "vgpr", "sgpr", "lds", "workgroup" or "waves")."""
    f = AMD_FACTS[arch]
    top = f.max_waves_per_simd
    by_vgpr = min(top, f.vgprs_per_simd // (_ceil_div(max(vgpr, 1), f.vgpr_granule)
                                              * f.vgpr_granule))
    by_sgpr = min(top, f.sgprs_per_simd // sgpr) if f.sgprs_per_simd and sgpr else top
    waves_per_wg = _ceil_div(block_size, wave_size)
    slots = top * f.simds_per_cu
    wgs = slots if waves_per_wg == 1 else min(slots // waves_per_wg, f.barriers_per_cu)
    wg_limit = "workgroup"
    if lds_bytes > 0 and f.lds_per_cu // lds_bytes < wgs:
        wgs, wg_limit = f.lds_per_cu // lds_bytes, "lds"
    by_wg = 0 if wgs == 0 else min(top, max(1, _ceil_div(wgs * waves_per_wg, f.simds_per_cu)))
    waves = min(by_vgpr, by_sgpr, by_wg)
    if waves == top:
        return waves, "waves"
    limit = "vgpr" if waves == by_vgpr else "sgpr" if waves == by_sgpr else wg_limit
    return waves, limit


def derived_resources(target: Target, resources: dict[str, Any], block_size: int,
                      lds_bytes: int) -> dict[str, Any]:
    """What the raw counts imply, for the manifest and `peerdsl.compile`:
    AMD: lds_bytes, waves_per_simd and occupancy_limit; NVIDIA: local_bytes (the stack frame
    ptxas reserves in local memory, spills included) and shared_bytes."""
    if target.is_amd:
        waves, limit = amd_occupancy(target.arch, target.wave_size, block_size,
                                     int(resources.get("vgpr", 0)), int(resources.get("sgpr", 0)),
                                     lds_bytes)
        return {"lds_bytes": lds_bytes, "waves_per_simd": waves, "occupancy_limit": limit}
    return {"local_bytes": int(resources.get("stack_bytes", 0)),
            "shared_bytes": int(resources.get("smem_bytes", lds_bytes))}
