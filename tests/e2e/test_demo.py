"""`mlops demo`, the README's main job, on a small feed: lands, ingests, builds features, trains and gates a
champion, then a day more and a challenger through the gate."""

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
        [mlops, "demo", "--days", "3", "--rows-per-day", "1500", "--epochs", "3", "--json"],
        capture_output=True,
        text=True,
        # three days of data: keep the transactions of all but the last day
        env={**os.environ, "MLOPS_HOME": str(home), "MLOPS_TRAINING__LABEL_MATURITY_DAYS": "1"},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["dates"] == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert 0 < summary["rows_silver"] < summary["rows_written"]  # duplicates and broken rows are removed
    assert summary["rows_quarantined"] > 0 and summary["rows_materialized"] > 0
    assert len(set(summary["dataset_revs"])) == 3
    first, second = summary["retrains"]
    assert (first["as_of"], second["as_of"]) == ("2026-01-02", "2026-01-03")
    assert first["previous_champion"] is None
    assert (first["model_version"], second["model_version"]) == ("1", "2")
    # the challenger was judged against whatever the first run left as champion
    assert second["previous_champion"] == first["champion_version"]
    assert summary["champion_version"] == second["champion_version"]
    for retrain in (first, second):
        assert retrain["decision"] in {"promoted", "rejected"} and retrain["reason"]
    assert set(summary["seconds_per_stage"]) == {"land", "ingest", "features", "retrain"}
