"""Per-architecture facts. PURE DATA: the runtime imports this on machines without MLIR.

Only `lowering/` (and runtimes choosing a code object) consult these; the DSL source is the
same for every target.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Target:
    arch: str                 # "gfx1250", "sm_90", ...
    vendor: str               # "amd" | "nvidia"
    wave_size: int
    fp8_format: str           # "e4m3fn" | "e4m3fnuz"
    code_object_ext: str      # "hsaco" | "cubin"
    isa_ext: str              # ".s" (AMDGPU assembly) | ".ptx"
    elf_mach: int | None      # AMD: e_flags & 0xff (EF_AMDGPU_MACH_*); None for NVIDIA
    # DSL scope -> LLVM syncscope string ("" is the system scope on both backends)
    syncscopes: tuple[tuple[str, str], ...]
    # globaltimer: nanoseconds per tick of the steady counter (AMD realtime is 100 MHz)
    timer_ns_per_tick: int
    # A scoped 16-byte access becomes llvm.amdgcn.av.{load,store}.b128 (one instruction with
    # the scope's cache bits, no wait after it) instead of a volatile access (which waits for
    # completion after every access). Polls inside a `while` stay volatile: LLVM hoists an
    # av load out of a loop without stores. Verified on gfx1250 only.
    scoped_vector_av: bool = False
    # Packs of a row the norm kernels read before storing any (ops/_rows.py
    # residual_norm_row; 0: the whole row). 1 keeps gfx1250's VGPRs near the HIP reference;
    # on the H200 one pack at a time cost 34% at TP2, 1024 rows (benchmarks/RESULTS.md), so
    # sm_90 reads 4 packs (the whole row up to H = 8192) ahead: more than 4 of 8 spills at
    # H = 16384 under its 128-register cap. A build variant (constexpr R), one per target.
    row_reads_ahead: int = 1
    # Whether LLVM may turn scalar code into vector code (SLP: f32 pairs as v_pk_*_f32).
    # On gfx1250 the pairing costs registers where many 16-byte loads are in flight: SLP
    # places the f32 unpacks of all W peer packs ahead of each pair's rank-order adds, so
    # the fused one-stage kernel's first schedule overshoots 64 VGPRs (16 waves) and the
    # scheduler then settles for fewer waves: 88-112 VGPRs at W=8 against the HIP
    # reference's 58-76; scalar, 51-67 and the same loads in flight. Wide loads the DSL
    # wants are explicit vectors (dsl/memory.py load_run), not left to LLVM to merge.
    auto_vectorize: bool = True
    # Whether dsl.schedule_fence lowers to llvm.amdgcn.sched.barrier (else it is dropped).
    # gfx1250: LLVM scheduled a pack's 8 software FP8 conversions together (about 5 live
    # temporaries each) while the next pack's values were live, far below the 64-VGPR
    # occupancy line, so nothing told it to save registers: the fused one-stage kernel at
    # W = 2 took 51 / 61 VGPRs at H = 4096 / 6144 against the HIP reference's 42 / 48.
    schedule_fences: bool = False
    # (H, threads per row) of the specialized norm-family kernels where not NORM_BLOCK's 256
    # (ops/_row_slots.py norm_block): every norm kernel of a target at that H takes it, so
    # fused == unfused holds. sm_90, H = 2880: a row's 360 packs fill 94% of 384 threads'
    # one slot, against 70% of 256 threads' two; 40 registers, 4 blocks per SM. Call M1 on
    # an H100 (four ranks at once, 4096 rows): add_rmsnorm 128.5 / 128.8 us against 136.0 /
    # 136.2 at 256 (Triton's norm 128.0 / 128.5), the split path's gather 130.3 / 130.6
    # against 139.6 / 140.1; 192 x 2 slots ran within 1%, 512 threads 2-4% slower.
    # sm_90, H = 7168: 896 packs fill 224 threads' four slots, against 87.5% of 256 threads'
    # (the same slots a thread, so the collective kernels keep their registers and blocks per
    # SM). Call M8 (four ranks at once): add_rmsnorm 313.5-314.4 us at 4096 rows against
    # 327.8 / 328.0 at 256 (Triton's 314.4 / 314.5), the gather 316.7 / 316.8 against 329.3 /
    # 330.7, 8-13% faster at 256 rows; 448 threads x 2 slots ran the same, 896 x 1 slower.
    norm_threads: tuple[tuple[int, int], ...] = ()
    # Pack slots a thread of a one-block-per-row runtime-H kernel (add + RMSNorm, the split
    # path's gather, the FP8 quant) may hold for its reads to be predicated, all in flight
    # at once, rather than each slot's loads waiting in a branch of their own (ops/
    # _row_slots.py slot_pack). 4 covers MAXH <= 8192. sm_90 predicates MAXH 12288 and
    # 16384 too: 96-128 registers, no spill (these kernels are not collectives, so no peer
    # waits on their residency); on gfx1250 the same cut occupancy (add + RMSNorm at
    # MAXH 16384: 9 waves a SIMD from 10, the quant 6 from 12), so AMD targets keep 4.
    predicated_row_slots: int = 4
    # The same for the fused one-stage runtime-H kernel, by world size (a world not listed:
    # ops/_row_slots.py PREDICATED_PER_THREAD). It is a collective holding W ranks' packs of
    # each slot, so fewer slots fit as W grows. sm_90 (ptxas 12.9): W = 2 fits 8 (95-122
    # registers; 17-27% faster at TP2, MAXH 12288 and 16384, call Q3); W = 4 fits 6 (MAXH
    # 12288: 115 / 126 registers, where 8 spilled 16 bytes at MAXH 16384); W = 8 at 6
    # spilled 12 bytes (f16), so it keeps 4.
    one_stage_predicated_slots: tuple[tuple[int, int], ...] = ()

    @property
    def is_amd(self) -> bool:
        return self.vendor == "amd"

    @property
    def is_nvidia(self) -> bool:
        return self.vendor == "nvidia"

    def syncscope(self, scope: str) -> str:
        return dict(self.syncscopes)[scope]

    @property
    def fp8_max(self) -> float:
        return 448.0 if self.fp8_format == "e4m3fn" else 240.0


_AMD_SCOPES = (("wave", "wavefront"), ("workgroup", "workgroup"), ("agent", "agent"),
               ("system", ""))
# PTX has no warp memory scope: a wave-scope access is made CTA-scoped (stronger, still correct).
_NV_SCOPES = (("wave", "block"), ("workgroup", "block"), ("agent", "device"), ("system", ""))


def _amd(arch: str, wave: int, fp8: str, mach: int, av: bool = False,
         vectorize: bool = True, fences: bool = False) -> Target:
    return Target(arch, "amd", wave, fp8, "hsaco", ".s", mach, _AMD_SCOPES, 10, av,
                  auto_vectorize=vectorize, schedule_fences=fences)


TARGETS: dict[str, Target] = {
    "gfx1250": _amd("gfx1250", 32, "e4m3fn", 0x49, av=True, vectorize=False,
                    fences=True),
    "gfx950": _amd("gfx950", 64, "e4m3fn", 0x4F),
    "gfx942": _amd("gfx942", 64, "e4m3fnuz", 0x4C),
    "sm_90": Target("sm_90", "nvidia", 32, "e4m3fn", "cubin", ".ptx", None, _NV_SCOPES, 1,
                    row_reads_ahead=4, norm_threads=((2880, 384), (7168, 224)),
                    predicated_row_slots=8, one_stage_predicated_slots=((2, 8), (4, 6))),
}

PRIMARY = "gfx1250"


def supported() -> list[str]:
    return list(TARGETS)


def get_target(arch: "str | Target") -> Target:
    """The Target for an arch name; a clear error names the arch and the supported list."""
    if isinstance(arch, Target):
        return arch
    if arch not in TARGETS:
        raise ValueError(f"unsupported target arch {arch!r}; supported: {', '.join(TARGETS)}")
    return TARGETS[arch]
