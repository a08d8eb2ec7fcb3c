"""benchmarks/rank_harness.py: the rank processes every multi-rank GPU benchmark runs."""
from __future__ import annotations

import sys

from benchmarks.rank_harness import run_ranks

REPORTER = ("import json, sys; r, w, port = map(int, sys.argv[-3:]); "
            "print('noise'); print('REPORT ' + json.dumps({'rank': r, 'world': w}))")


def test_reports_come_back_in_rank_order():
    reps = run_ranks([sys.executable, "-c", REPORTER], 3, {}, 30)
    assert reps == [{"rank": r, "world": 3} for r in range(3)]


def test_a_silent_rank_gives_none_and_its_output(capsys):
    silent = "import sys; print('rank', sys.argv[-3], 'failed')"
    assert run_ranks([sys.executable, "-c", silent], 2, {}, 30) is None
    assert "a rank gave no report" in capsys.readouterr().out


def test_ranks_past_the_deadline_are_killed(capsys):
    hang = "import time; time.sleep(60)"
    assert run_ranks([sys.executable, "-c", hang], 2, {}, 1.0) is None
    assert "killed at the timeout" in capsys.readouterr().out
