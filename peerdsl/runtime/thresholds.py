"""The dispatch thresholds per target (SPEC section 5) and why sm_90's differ.

gfx1250 defaults are the SPEC's table; gfx950 and gfx942 keep it until measured. sm_90 has
its own LL cap: on the lent H200 (ranks sharing one GPU's HBM, benchmarks/RESULTS.md) the LL
all-reduce, which moves four times the bytes of the one-stage kernel, cost 13 us at 16 rows
and 46 us at 64 rows (TP4, H=6144) while the two-stage kernel took 43 us at 384 rows, so LL
only pays below about 128 KiB there; at TP2 up to 320 KiB (call N6, 2026-12-07, H100: there
the LL kernel beat the one-stage one, whose end barrier pays SPEC section 3's release, up to
288 KiB). For the fused entry the one-stage kernel beat LL + add +
RMSNorm at every row count measured (1 to 256 rows, TP2 and TP4, H 2880/6144/8192: e.g. TP4
H=6144 one row 10.5 vs 12.3 us), so sm_90's fused LL range is empty; and the one-stage fused
kernel beat the two-stage one up to 256 rows at TP4 (H=6144: 9.5 vs 11.7 us at 16 rows, 29.5
vs 32.9 at 256; H=8192 likewise), and on 2026-12-03 it also won from 384 to 4096 rows in two
runs (TP4 H=6144: 40.1 vs 44.1 us at 384 rows, 87.9 vs 97.9 at 1024, 311.7 vs 342.3 at 4096).
Then the two-stage kernel got its sm_90 schedules (runtime/kernel_variants.py
`FUSED_2STAGE`: more shard packs and rows in flight), and in call F1 it won at TP4 from
2 MiB (H 2880/6144/8192), so sm_90's fused entry took it from there, H = 2880 included
(`fused_two_stage_min_hidden`). Call L3 (2026-12-06, TP4, twice interleaved) moved that to
768 KiB: with V = 1 row in flight up to 256 rows (runtime/kernel_variants.py) it beat the
one-stage kernel at 64-256 rows (H = 6144 64 rows 10.9 / 12.5 us against 13.4 / 12.6, 128
rows 14.0 / 14.0 against 17.8 / 17.7; H = 2880 256 rows 17.9 / 17.1 against 19.4 / 20.0).
At some hidden sizes its schedule is split (stage 1, then a gather launch of its own grid:
`FUSED_2STAGE` split_hidden), which in call G4 also won at TP2 from 1024 rows (H = 2880), so
there the fused entry takes it from 4 MiB (`fused_split_min_bytes`). The later choices are
dated beside the table below.

runtime/dispatch.py applies these, with a `PEERDSL_*` environment override for every
threshold, read at each call; nothing here reads the environment.
"""
from __future__ import annotations

import dataclasses

from ..ops._row_slots import kernel_size

MiB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Thresholds:
    ll_max_bytes: int = 4 * MiB
    custom_ar_max_bytes: int = 64 * MiB
    staging_bytes: int = 16 * MiB
    two_stage_min_world: int = 4
    two_stage_min_hidden: int = 6144
    ar_quant_max_bytes: int = 64 * MiB
    fused_quant_forms: tuple[str, ...] = ("per_token",)  # others take the unfused path
    qk_norm_fused: bool = False
    # the fused entry's LL range (None: ll_max_bytes, as in SPEC section 5); a target where
    # the one-stage fused kernel beats LL + add + RMSNorm sets its own
    fused_ll_max_bytes: int | None = None
    fused_two_stage_min_bytes: int = 0  # below it the fused entry takes the one-stage kernel
    fused_two_stage_min_hidden: int | None = None  # None: two_stage_min_hidden
    two_stage_min_bytes: int = 0  # below it the plain all-reduce takes the one-stage kernel
    # below two_stage_min_world: the fused entry takes the two-stage kernel from these bytes
    # where its schedule splits (FUSED_2STAGE split_hidden); None: never
    fused_split_min_bytes: int | None = None
    # (world, bytes): the plain all-reduce's LL range for that world size in place of
    # ll_max_bytes (PEERDSL_LL_MAX_BYTES, where set, is every world's); never past the
    # scratch a communicator allocated
    ll_max_bytes_by_world: tuple[tuple[int, int], ...] = ()
    # (world, runtime-H bound MAXH, bytes): the fused entry's two-stage floor at a hidden
    # size the runtime-H kernels serve, in place of fused_two_stage_min_bytes
    # (PEERDSL_FUSED_TWO_STAGE_MIN_BYTES, where set, is every size's)
    fused_two_stage_min_bytes_runtime_h: tuple[tuple[int, int, int], ...] = ()

    def ll_cap(self, world: int) -> int:
        """The plain all-reduce's LL range at `world` ranks."""
        return dict(self.ll_max_bytes_by_world).get(world, self.ll_max_bytes)

    def fused_ll_cap(self, world: int) -> int:
        """The fused entry's LL range at `world` ranks: never past the plain all-reduce's,
        whose LL kernel its two-launch form runs."""
        if self.fused_ll_max_bytes is None:
            return self.ll_cap(world)
        return min(self.fused_ll_max_bytes, self.ll_cap(world))

    def fused_two_stage_floor(self, world: int, hidden: int) -> int:
        """The fused entry's two-stage floor in bytes for `hidden` at `world` ranks."""
        if self.fused_two_stage_min_bytes_runtime_h:
            bound, runtime_h = kernel_size(hidden)
            if runtime_h:
                for w, maxh, nbytes in self.fused_two_stage_min_bytes_runtime_h:
                    if (w, maxh) == (world, bound):
                        return nbytes
        return self.fused_two_stage_min_bytes


TABLES = {
    "gfx1250": Thresholds(),
    "gfx950": Thresholds(),
    "gfx942": Thresholds(),
    # two_stage_min_bytes: the one-stage all-reduce up to the 64 MiB custom cap. The
    # two-stage kernel won at no row count measured: at TP4, H = 6144 x 4096 rows (48 MiB)
    # the two tied on the H200 (2026-12-03: 144.4 / 142.0 us), and on the H100 of call L6
    # (2026-12-06, twice interleaved) the one-stage kernel took 168.6 / 174.5 against 191.2
    # / 192.0 (vLLM 180-184); at 8192 x 4096 223.2 / 225.1 against 251.9 / 257.2 (vLLM
    # 240-246); 8192 x 2048 tied. So two-stage only past that cap, where nothing was measured
    # fused_two_stage_*: call F1 (2026-12-03, RESULTS.md), TP4, the two-stage kernel with
    # U=4 and V=2 rows (V=1 at 8192) beat the one-stage one from 384 rows at H=2880 (26.9 vs
    # 30.1 us), from 256 rows at 6144 (2048: 146.8 vs 169.2) and at 8192 (256: 36.3 vs
    # 38.2; 4096: 372.0 vs 404.7); with V = 1 up to 256 rows it also wins from 768 KiB
    # (call L3, 2026-12-06: H = 6144 and 8192 from 64 rows, 2880 at 256 rows)
    # ll_max_bytes_by_world: at TP2 the LL kernel (no barrier) beat the one-stage one (its
    # end barrier's release, SPEC section 3) on the mean of two rounds up to 288 KiB and
    # lost from 384 KiB (call N6, 2026-12-07, H100, twice interleaved: 6144 x 16 rows 4.2 /
    # 4.7 us against 4.9 / 5.5, 8192 x 16 4.6 / 4.6 against 5.8 / 5.7, 6144 x 24 5.9 / 5.7
    # against 6.3 / 6.3; 6144 x 32 8.0 / 6.5 against 6.4 / 5.5); TP4 keeps 128 KiB, not
    # re-measured on the H100 between
    # 128 and 768 KiB (call J1, H200: LL 9.4 us at 16 rows, even with the one-stage kernel,
    # and 21.7 at 64 rows against 10.3-11.5); on the H100 (call P2, twice interleaved) LL
    # lost from 135 KiB (6144 x 16 rows 10.6 / 12.1 against 7.3 / 8.6)
    # fused_two_stage_min_bytes_runtime_h: at TP4 the runtime-H one-stage kernel beat the
    # runtime-H two-stage one below these floors (calls N2, P1, P2, 2026-12-07, H100, 2-6
    # samples a cell). MAXH 2048 (H = 2048): 1 MiB one-stage 14.5 us on the mean of six
    # against 16.3 for the split kernel dispatch took; 1.5 MiB split 19.1 against 20.1;
    # 2 MiB split 22.6 / 23.8 against 27.4 / 28.6. MAXH 4096 (3584): 1.75 MiB one-stage 21.9
    # (mean of four) against 22.7; 2.6 MiB split 31.0 / 32.8 against 34.7 / 35.2. MAXH 6144
    # (5120): one-stage ahead at 1.25-5 MiB (2.5 MiB: 27.0-31.5 against 28.4-38.0) and 2%
    # at 10 MiB (86.1 against 87.7, mean of four), two-stage 1% ahead at 20 MiB (157.9
    # against 159.5) and 3% at 40 MiB. MAXH 8192 (7680) keeps 768 KiB: even at 128-256 rows,
    # the two-stage kernel 3-6% ahead from 512 rows, and at 64 rows 14.1 against 15.0.
    # MAXH 12288 (the two-stage kernel split there: kernel_variants split_bounds): since
    # the one-stage kernel predicates its reads at W = 4 too (call R1, H100), it is ahead of
    # the U = 4 split up to 24 MiB and behind from 30: A/B twice, forced, 10240 x 1024 rows
    # (20 MiB) 175.1 / 176.9 us against 185.2 / 198.6, 12288 x 1024 (24 MiB) 190.2 / 204.0
    # against 210.0 / 218.4, 256 rows 55.4-68.6 against 57.6-67.8; R2's sweep 10240 x 1536
    # rows (30 MiB) 318.2 against 282.9, 12288 x 1536 (36 MiB) 341.5 against 301.0. The
    # floor sits where the ratios cross (about 26 MiB). Before (P4, guarded one-stage
    # reads) the split led from 5 MiB. At 1.25-1.5 MiB (64 rows) the two are within noise;
    # MAXH 16384 (its one-stage reads guarded at W = 4) keeps 768 KiB (the U = 0 split
    # already the fastest path from 64 rows in P3: 26.7 / 28.0 against 29.0 / 29.5; U = 4
    # ahead of it by 0-3%)
    "sm_90": Thresholds(ll_max_bytes=128 << 10, fused_ll_max_bytes=0,
                        fused_two_stage_min_bytes=768 << 10, fused_two_stage_min_hidden=2048,
                        two_stage_min_bytes=128 * MiB, fused_split_min_bytes=4 * MiB,
                        ll_max_bytes_by_world=((2, 320 << 10),),
                        fused_two_stage_min_bytes_runtime_h=(
                            (4, 2048, 3 * MiB // 2), (4, 4096, 2 * MiB), (4, 6144, 16 * MiB),
                            (4, 12288, 26 * MiB))),
}
