"""`mlops demo`, the README's main job, on a small feed: lands, ingests and builds features end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def test_the_demo_runs_the_loop_and_reports_one_json_line(tmp_path):
    mlops = str(Path(sys.executable).with_name("mlops"))
    home = tmp_path / "home"
    done = subprocess.run(
        [mlops, "demo", "--days", "2", "--rows-per-day", "400", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "MLOPS_HOME": str(home)},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["dates"] == ["2026-01-01", "2026-01-02"]
    assert 0 < summary["rows_silver"] < summary["rows_written"]  # duplicates and broken rows are removed
    assert summary["rows_quarantined"] > 0 and summary["rows_materialized"] > 0
    assert len(set(summary["dataset_revs"])) == 2
