"""The benchmark summary's pure functions (no GPU): ranks merged, the peers' side-by-side
table (benchmarks/peer_vllm.py) with its ratios."""
from benchmarks.bench_report import merge
from benchmarks.peer_vllm import peers_table


def _rank(ar_us: float, equal: bool) -> dict:
    return {"null_us": 3.0, "rows": {"6144:1024": {
        "path": "fused_2stage", "ar_path": "2stage", "ar_us": ar_us, "rms_us": 20.0,
        "fused_us": 80.0, "pair_us": 100.0, "vllm_ar1_us": 60.0, "vllm_ar2_us": 50.0,
        "vllm_ar_us": 50.0, "vllm_rule_stage": 2, "triton_us": 40.0, "vllm_pair_us": 96.0,
        "vllm_1stage_equal": equal}}}


def test_merge_takes_the_slowest_rank_and_every_ranks_check():
    merged = merge([_rank(40.0, True), _rank(45.0, False)])
    row = merged["rows"]["6144:1024"]
    assert row["ar_us"] == 45.0
    assert row["vllm_1stage_equal"] is False  # one rank's mismatch is the run's
    assert row["vllm_rule_stage"] == 2 and row["path"] == "fused_2stage"


def test_peers_table_ratios_are_peer_over_ours():
    summary = {"tp4": merge([_rank(40.0, True)]),
               "triton_alone_us": {"6144": {"1024": 14.0}}}
    table = peers_table(summary)
    line = [ln for ln in table.splitlines() if ln.startswith("| 6144 | 1024 |")][0]
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2] == "40.0" and cells[3] == "60.0 / 50.0"
    assert cells[4] == "1.25"               # vLLM's faster kernel / ours
    assert cells[6:8] == ["96.0", "1.20"]   # the vLLM + Triton pair in one graph / fused
    assert cells[8:10] == ["64.0", "0.80"]  # vLLM AR + Triton alone (the sum) / fused
    assert cells[10] == "100.0" and cells[11] == "True"


def test_peers_table_is_empty_without_peer_figures():
    rank = _rank(40.0, True)
    for key in ("vllm_ar_us", "vllm_pair_us"):
        del rank["rows"]["6144:1024"][key]
    assert peers_table({"tp2": merge([rank])}) == ""


def test_sweep_forces_each_one_stage_rows_variant(monkeypatch):
    """forced_paths.forced_paths on sm_90 times the plain one-stage kernel (R1 forced, the
    bare label) and each built rows-per-iteration variant, and restores the environment."""
    import os
    import types

    import torch

    from benchmarks import forced_paths as B

    seen = []

    class Comm:
        arch, world = "sm_90", 4
        meta_layout = types.SimpleNamespace(ll_max_bytes=1 << 22)
        graph_capture = None

        def fused_allreduce_rmsnorm(self, x, res, w):
            seen.append((os.environ.get("PEERDSL_FUSED_PATH"),
                         os.environ.get("PEERDSL_FUSED_1STAGE_ROWS")))
            return types.SimpleNamespace(out=x.clone(), residual_out=res.clone())

    monkeypatch.delenv("PEERDSL_FUSED_1STAGE_ROWS", raising=False)
    monkeypatch.setattr(B, "graph_time_us", lambda *a, **k: 1.0)
    x = torch.zeros(64, 2880, dtype=torch.bfloat16)
    got = B.forced_paths(torch, Comm(), x, x, x[0], None, None)
    assert {"fused_1stage_us", "fused_1stage:R2_us", "fused_1stage:R4_us"} <= set(got)
    assert ("fused_1stage", "1") in seen and ("fused_1stage", "4") in seen
    assert "mismatch" not in got and "PEERDSL_FUSED_1STAGE_ROWS" not in os.environ
    assert seen[0][0] == "unfused"  # the reference every fused path's bytes are checked against

    # a path whose bytes differ from the unfused ones is named
    class Off(Comm):
        def fused_allreduce_rmsnorm(self, x, res, w):
            r = super().fused_allreduce_rmsnorm(x, res, w)
            if os.environ.get("PEERDSL_FUSED_1STAGE_ROWS") == "2":
                r.out.view(torch.int16)[0, 0] += 1
            return r
    assert B.forced_paths(torch, Off(), x, x, x[0], None, None)["mismatch"] == [
        "fused_1stage:R2"]


def test_sweep_forces_only_built_variants():
    """Every schedule and rows-per-iteration variant the sm_90 sweep forces is one the build
    holds, with the target's threads a row at each size (call M2's sweep forced U4 schedules
    at H = 2880, which 384 threads a row do not build, and a rank stopped)."""
    from benchmarks import forced_paths as B
    from peerdsl.lowering.targets import get_target
    from peerdsl.ops import registry
    from peerdsl.ops._row_slots import SUPPORTED_HIDDEN

    sm90, ops = get_target("sm_90"), registry.load_all()
    two_stage = ops["fused_ar_rms_2stage"].variants(sm90)
    rows = ops["fused_ar_rms_1stage_rows"].variants(sm90)
    for H in SUPPORTED_HIDDEN:
        for W in (2, 4):
            for sched in B.fused_schedules(H, W):
                assert any(v["H"] == H and v["W"] == W and all(v[k] == sched[k] for k in sched)
                           for v in two_stage), (H, W, sched)
            for r in B.one_stage_rows(H, W):
                assert any(v["H"] == H and v["W"] == W and v["V"] == r["R"] for v in rows), (H, W)
    # a size that is not specialized: the runtime-H kernel of its bound, which the rows
    # kernel is not built for
    runtime_h = ops["fused_ar_rms_2stage_runtime_h"].variants(sm90)
    for H, bound, forced in ((2048, 2048, False), (3584, 4096, False), (5120, 6144, False),
                             (12288, 12288, False), (2880, 4096, True), (7168, 8192, True)):
        for W in (2, 4):
            scheds = B.fused_schedules(H, W, forced)
            assert any(s.get("S") == 1 for s in scheds) and not B.one_stage_rows(H, W, forced)
            for sched in scheds:
                assert any(v["MAXH"] == bound and v["W"] == W and
                           all(v[k] == sched[k] for k in sched) for v in runtime_h), (H, W, sched)


def test_rounds_take_each_rounds_slowest_rank_then_the_median():
    """BENCH_ROUNDS: the rank-merged samples are max over ranks per round, and the time
    reported is their median, not the max of the ranks' own medians."""
    from benchmarks.bench_ar_rms import rounds_of
    samples = iter([{"fused_us": 3.0, "path": "x"}, {"fused_us": 5.0, "path": "x"},
                    {"fused_us": 4.0, "path": "x"}])
    fast = rounds_of(lambda: next(samples), 3)
    assert fast == {"fused_us": 3.0, "path": "x", "fused_us_rounds": [3.0, 5.0, 4.0]}
    slow = {"fused_us": 9.0, "path": "x", "fused_us_rounds": [4.0, 1.0, 9.0]}
    row = merge([{"null_us": 1.0, "rows": {"k": fast}},
                 {"null_us": 1.0, "rows": {"k": slow}}])["rows"]["k"]
    assert row["fused_us_rounds"] == [4.0, 5.0, 9.0]
    assert row["fused_us"] == 5.0  # the ranks' own medians would give max(4, 4) = 4
    assert rounds_of(lambda: {"fused_us": 2.0}, 1) == {"fused_us": 2.0}
