"""The fault suite's figures: every case's ranks, calls, exact results, errors and
corruptions, printed at the end of the run (and written as JSON to $PEERDSL_FAULT_REPORT,
which docs/RELIABILITY.md's table comes from)."""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # reference


def pytest_terminal_summary(terminalreporter):
    from fault_harness import STATS
    if not STATS:
        return
    total = {k: sum(s[k] for s in STATS) for k in ("ranks", "calls", "exact", "errors",
                                                   "corruptions")}
    terminalreporter.write_line(
        f"fault suite: {len(STATS)} cases, {total['calls']} calls on {total['ranks']} ranks: "
        f"{total['exact']} exact, {total['errors']} named errors, "
        f"{total['corruptions']} corruptions")
    path = os.environ.get("PEERDSL_FAULT_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump({"cases": STATS, "total": total}, f, indent=1)
