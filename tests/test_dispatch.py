"""SPEC section 5: the dispatch table, its env overrides, and forced paths."""
import pytest
import torch

from peerdsl.runtime import dispatch
from peerdsl.runtime.dispatch import MiB, plan_all_reduce, plan_fused_ar_rms

BF16 = torch.bfloat16


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(dispatch._ENV.values()) + ["PEERDSL_FUSED_PATH"]:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("world,rows,hidden,expected", [
    (1, 1024, 6144, "local"),
    (4, 1, 6144, "ll+rmsnorm"),
    (4, 341, 6144, "ll+rmsnorm"),             # 4,190,208 bytes <= 4 MiB
    (4, 342, 6144, "fused_2stage"),           # just over 4 MiB
    (4, 5400, 6144, "fused_2stage"),          # 66.4 MB: bytes / world just under 16 MiB
    (4, 1024, 6144, "fused_2stage"),
    (4, 5500, 6144, "fallback"),              # 67.6 MB > 64 MiB
    (2, 1024, 6144, "fused_1stage"),          # world < 4
    (4, 1024, 4096, "fused_1stage"),          # H < 6144
    (8, 2730, 6144, "fused_2stage"),
])
def test_table(world, rows, hidden, expected):
    assert plan_fused_ar_rms("gfx1250", world, rows, hidden, BF16) == expected


def test_not_contiguous_goes_unfused():
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16, contiguous=False) == "unfused"


def test_odd_bytes_goes_unfused():
    assert plan_fused_ar_rms("gfx1250", 4, 1, 2884, BF16) == "unfused"  # 5768 % 16 != 0


def test_staging_limit_sends_two_stage_to_one_stage(monkeypatch):
    monkeypatch.setenv("PEERDSL_STAGING_BYTES", str(1 * MiB))
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16) == "fused_1stage"


def test_overrides(monkeypatch):
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", str(64 * MiB))
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16) == "ll+rmsnorm"
    monkeypatch.setenv("PEERDSL_CUSTOM_AR_MAX_BYTES", str(1 * MiB))
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16) == "fallback"
    monkeypatch.delenv("PEERDSL_CUSTOM_AR_MAX_BYTES")
    monkeypatch.delenv("PEERDSL_LL_MAX_BYTES")
    monkeypatch.setenv("PEERDSL_TWO_STAGE_MIN_WORLD", "8")
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16) == "fused_1stage"
    monkeypatch.setenv("PEERDSL_TWO_STAGE_MIN_WORLD", "2")
    monkeypatch.setenv("PEERDSL_TWO_STAGE_MIN_HIDDEN", "4096")
    assert plan_fused_ar_rms("gfx1250", 2, 1024, 4096, BF16) == "fused_2stage"


def test_bad_override_names_the_variable(monkeypatch):
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", "four")
    with pytest.raises(ValueError, match="PEERDSL_LL_MAX_BYTES"):
        plan_fused_ar_rms("gfx1250", 4, 16, 6144, BF16)


def test_forced_paths(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
    assert plan_fused_ar_rms("gfx1250", 4, 16, 6144, BF16) == "fused_1stage"
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "unfused")
    assert plan_fused_ar_rms("gfx1250", 4, 16, 6144, BF16) == "unfused"
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "ll+rmsnorm")
    with pytest.raises(ValueError, match="LL cap"):
        plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16)
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_2stage")
    with pytest.raises(ValueError, match="two-stage"):
        plan_fused_ar_rms("gfx1250", 4, 16, 2880 + 8, BF16)
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "warp_speed")
    with pytest.raises(ValueError, match="warp_speed"):
        plan_fused_ar_rms("gfx1250", 4, 16, 6144, BF16)


def test_fp8_other_quant_forms_unfused():
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16, fp8_out=True,
                             quant="per_group") == "unfused"
    assert plan_fused_ar_rms("gfx1250", 4, 1024, 6144, BF16, fp8_out=True,
                             quant="mxfp4") == "unfused"


def test_fp8_epilogue_cap(monkeypatch):
    assert dispatch.fp8_in_epilogue("gfx1250", 1024, 6144, BF16)
    monkeypatch.setenv("PEERDSL_AR_QUANT_MAX_BYTES", str(1 * MiB))
    assert not dispatch.fp8_in_epilogue("gfx1250", 1024, 6144, BF16)


def test_qk_norm_raises_on_gfx1250():
    with pytest.raises(NotImplementedError, match="gfx1250"):
        dispatch.check_qk_norm("gfx1250")


def test_bad_world_and_arch_and_dtype():
    with pytest.raises(ValueError, match="world size 9"):
        plan_fused_ar_rms("gfx1250", 9, 16, 6144, BF16)
    with pytest.raises(ValueError, match="gfx9000"):
        plan_fused_ar_rms("gfx9000", 4, 16, 6144, BF16)
    with pytest.raises(TypeError, match="float32"):
        plan_fused_ar_rms("gfx1250", 4, 16, 6144, torch.float32)


def test_plain_all_reduce():
    assert plan_all_reduce("gfx1250", 1, 1024) == "local"
    assert plan_all_reduce("gfx1250", 4, 1024) == "ll"
    assert plan_all_reduce("gfx1250", 4, 12 * MiB) == "2stage"
    assert plan_all_reduce("gfx1250", 2, 12 * MiB) == "1stage"
    assert plan_all_reduce("gfx1250", 4, 65 * MiB) == "fallback"
    assert plan_all_reduce("gfx1250", 4, 1000) == "fallback"


def test_each_target_has_its_table():
    assert plan_fused_ar_rms("gfx950", 4, 16, 6144, BF16) == "ll+rmsnorm"
    assert plan_fused_ar_rms("gfx942", 4, 16, 6144, BF16) == "ll+rmsnorm"
    # sm_90: the plain all-reduce takes LL up to 128 KiB, the fused entry never (measured)
    assert plan_all_reduce("sm_90", 4, 96 << 10) == "ll"
    assert plan_all_reduce("sm_90", 4, 192 << 10) == "1stage"
    # one-stage up to the 64 MiB custom cap (call L6)
    assert plan_all_reduce("sm_90", 4, 48 * MiB) == "1stage"
    assert plan_all_reduce("sm_90", 4, 64 * MiB) == "1stage"
    assert plan_all_reduce("sm_90", 4, 65 * MiB) == "fallback"
    assert plan_fused_ar_rms("sm_90", 2, 1, 6144, BF16) == "fused_1stage"
    assert plan_fused_ar_rms("sm_90", 4, 8, 6144, BF16) == "fused_1stage"      # 96 KiB
    # the fused two-stage kernel from 768 KiB at TP4 (calls F1, L3), H = 2880 included; TP2 never
    assert plan_fused_ar_rms("sm_90", 4, 63, 6144, BF16) == "fused_1stage"   # 756 KiB
    assert plan_fused_ar_rms("sm_90", 4, 64, 6144, BF16) == "fused_2stage"   # 768 KiB
    assert plan_fused_ar_rms("sm_90", 4, 128, 2880, BF16) == "fused_1stage"    # 720 KiB
    assert plan_fused_ar_rms("sm_90", 4, 256, 2880, BF16) == "fused_2stage"    # 1.4 MiB
    assert plan_fused_ar_rms("sm_90", 4, 384, 2880, BF16) == "fused_2stage"    # 2.1 MiB
    assert plan_fused_ar_rms("sm_90", 4, 256, 6144, BF16) == "fused_2stage"    # 3 MiB
    assert plan_fused_ar_rms("sm_90", 4, 4096, 8192, BF16) == "fused_2stage"   # 64 MiB
    assert plan_fused_ar_rms("sm_90", 2, 4096, 6144, BF16) == "fused_1stage"
    # TP2 takes the two-stage kernel only where it runs split, from 4 MiB: 2880, and the
    # runtime-H sizes of bound 4096 (3072), not 4096 itself (calls M5/M6)
    assert plan_fused_ar_rms("sm_90", 2, 1024, 2880, BF16) == "fused_2stage"  # 5.6 MiB
    assert plan_fused_ar_rms("sm_90", 2, 512, 2880, BF16) == "fused_1stage"   # 2.8 MiB
    assert plan_fused_ar_rms("sm_90", 2, 1024, 3072, BF16) == "fused_2stage"
    assert plan_fused_ar_rms("sm_90", 2, 1024, 4096, BF16) == "fused_1stage"
    assert plan_fused_ar_rms("gfx1250", 4, 384, 2880, BF16) != "fused_2stage"  # the PR's table


def test_fused_ll_range_has_its_own_override(monkeypatch):
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", str(128 << 10))
    assert plan_fused_ar_rms("sm_90", 4, 8, 6144, BF16) == "ll+rmsnorm"   # 96 KiB
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", str(8 * MiB))     # capped by the LL cap
    assert plan_fused_ar_rms("sm_90", 4, 16, 6144, BF16) == "fused_1stage"  # 192 KiB
    monkeypatch.setenv("PEERDSL_FUSED_TWO_STAGE_MIN_BYTES", "0")
    assert plan_fused_ar_rms("sm_90", 4, 16, 6144, BF16) == "fused_2stage"
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", "-1")
    with pytest.raises(ValueError, match="must be >= 0"):
        plan_fused_ar_rms("sm_90", 4, 16, 6144, BF16)
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", "0")
    assert plan_fused_ar_rms("gfx1250", 4, 16, 6144, BF16) == "fused_2stage"


def test_sm90_plain_all_reduce_ll_range_per_world(monkeypatch):
    """sm_90's LL range is 320 KiB at TP2 and 128 KiB at other worlds (call N6); the
    variable sets every world's, and a smaller scratch caps each."""
    assert plan_all_reduce("sm_90", 2, 320 << 10) == "ll"
    assert plan_all_reduce("sm_90", 2, (320 << 10) + 16) == "1stage"
    assert plan_all_reduce("sm_90", 4, 192 << 10) == "1stage"
    assert plan_all_reduce("sm_90", 4, 128 << 10) == "ll"
    assert plan_all_reduce("sm_90", 2, 192 << 10, capacity={"ll_max_bytes": 64 << 10}) \
        == "1stage"
    assert plan_all_reduce("gfx1250", 2, 4 * MiB) == "ll"  # the SPEC table: one range
    monkeypatch.setenv("PEERDSL_FUSED_PATH", "ll+rmsnorm")  # forcing follows the same range
    assert plan_fused_ar_rms("sm_90", 2, 16, 6144, BF16) == "ll+rmsnorm"  # 192 KiB
    with pytest.raises(ValueError, match="LL cap 131072 at world size 4"):
        plan_fused_ar_rms("sm_90", 4, 16, 6144, BF16)
    monkeypatch.delenv("PEERDSL_FUSED_PATH")
    monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", str(320 << 10))  # the fused entry's too
    assert plan_fused_ar_rms("sm_90", 2, 16, 6144, BF16) == "ll+rmsnorm"
    assert plan_fused_ar_rms("sm_90", 4, 16, 6144, BF16) != "ll+rmsnorm"
    monkeypatch.delenv("PEERDSL_FUSED_LL_MAX_BYTES")
    monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", str(64 << 10))
    assert plan_all_reduce("sm_90", 2, 192 << 10) == "1stage"
    assert plan_all_reduce("sm_90", 2, 64 << 10) == "ll"


def test_sm90_fused_two_stage_floor_per_runtime_h_bound(monkeypatch):
    """At TP4 the sizes the runtime-H kernels serve take the two-stage kernel from their
    bound's floor (calls P1-P4), the specialized sizes from fused_two_stage_min_bytes;
    PEERDSL_FUSED_TWO_STAGE_MIN_BYTES sets every size's."""
    plan = lambda w, rows, h: plan_fused_ar_rms("sm_90", w, rows, h, BF16)  # noqa: E731
    assert plan(4, 256, 2048) == "fused_1stage"    # MAXH 2048, 1 MiB
    assert plan(4, 384, 2048) == "fused_2stage"    # 1.5 MiB
    assert plan(4, 256, 3584) == "fused_1stage"    # MAXH 4096, 1.75 MiB
    assert plan(4, 1024, 3584) == "fused_2stage"
    assert plan(4, 1024, 5120) == "fused_1stage"   # MAXH 6144, 10 MiB
    assert plan(4, 2048, 5120) == "fused_2stage"   # 20 MiB
    assert plan(4, 1024, 12288) == "fused_1stage"  # MAXH 12288, 24 MiB
    assert plan(4, 1536, 10240) == "fused_2stage"  # 30 MiB
    assert plan(4, 64, 16384) == "fused_2stage"    # MAXH 16384: from 768 KiB
    assert plan(4, 16, 16384) == "fused_1stage"
    assert plan(4, 64, 6144) == "fused_2stage"     # specialized: from 768 KiB
    assert plan(4, 256, 2880) == "fused_2stage"
    assert plan(2, 256, 5120) == "fused_1stage"    # TP2: its own split route only
    t = dispatch.thresholds("sm_90")
    assert t.fused_two_stage_floor(8, 5120) == t.fused_two_stage_min_bytes  # W = 8: unmeasured
    from peerdsl.ops._row_slots import RUNTIME_MAXH  # every bound named is one that is built
    from peerdsl.runtime.kernel_variants import FUSED_2STAGE
    assert {m for _, m, _ in t.fused_two_stage_min_bytes_runtime_h} <= set(RUNTIME_MAXH)
    assert set(FUSED_2STAGE["sm_90"][4]["split_bounds"]) <= set(RUNTIME_MAXH)
    assert dispatch.thresholds("gfx1250").fused_two_stage_floor(4, 5120) == 0
    monkeypatch.setenv("PEERDSL_FUSED_TWO_STAGE_MIN_BYTES", str(1 * MiB))
    assert plan(4, 256, 2048) == "fused_2stage"
    assert plan(4, 1024, 5120) == "fused_2stage"
    assert plan(4, 64, 6144) == "fused_1stage"


@pytest.mark.parametrize("raw_environ", [True, False])
def test_cached_plans_follow_the_environment_at_once(monkeypatch, raw_environ):
    if not raw_environ:  # where os.environ has no dict of its own: os.environ.get per name
        monkeypatch.setattr(dispatch, "_ENV_KEYS", ())
    monkeypatch.setenv("PEERDSL_FUSED_TWO_STAGE_MIN_BYTES", "0")
    args = ("sm_90", 4, 16, 6144, BF16)
    cap = {"ll_max_bytes": 64 << 10, "staging_bytes": 16 * MiB}
    for _ in range(2):  # the second round is served from the caches
        assert plan_fused_ar_rms(*args) == "fused_2stage"  # 192 KiB: no fused LL on sm_90
        monkeypatch.setenv("PEERDSL_FUSED_LL_MAX_BYTES", str(1 * MiB))
        assert plan_fused_ar_rms(*args) == "fused_2stage"  # > sm_90's 128 KiB LL cap
        monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", str(1 * MiB))
        assert plan_fused_ar_rms(*args) == "ll+rmsnorm"
        assert plan_fused_ar_rms(*args, capacity=cap) == "fused_2stage"  # capped by the scratch
        assert plan_all_reduce("sm_90", 4, 192 << 10) == "ll"
        monkeypatch.setenv("PEERDSL_FUSED_PATH", "fused_1stage")
        assert plan_fused_ar_rms(*args) == "fused_1stage"
        monkeypatch.setenv("PEERDSL_LL_MAX_BYTES", "lots")   # errors are raised, not cached
        with pytest.raises(ValueError, match="PEERDSL_LL_MAX_BYTES"):
            plan_fused_ar_rms(*args)
        monkeypatch.delenv("PEERDSL_LL_MAX_BYTES")
        monkeypatch.delenv("PEERDSL_FUSED_LL_MAX_BYTES")
        monkeypatch.delenv("PEERDSL_FUSED_PATH")
        assert plan_all_reduce("sm_90", 4, 192 << 10) == "1stage"
        monkeypatch.setenv("PEERDSL_TWO_STAGE_MIN_BYTES", "0")
        assert plan_all_reduce("sm_90", 4, 192 << 10) == "2stage"
        monkeypatch.delenv("PEERDSL_TWO_STAGE_MIN_BYTES")
    with pytest.raises(ValueError, match="world size 4.0"):  # equal to 4 as a key, not as a world
        plan_fused_ar_rms("sm_90", 4.0, 16, 6144, BF16)
