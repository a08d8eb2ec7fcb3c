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
