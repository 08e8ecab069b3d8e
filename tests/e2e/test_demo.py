"""`mlops demo`, the README's main job, through Airflow on a small feed (the shared `demo_stack`): the
history is backfilled through `ingest_transactions`, each silver event schedules `build_features`, each
features event schedules `retrain_fraud_model`; then a day more arrives, the waiting ingest run picks it up
and the chain runs again up to the gate. Everything is read back from the JSON summary and Airflow's API."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import DEMO_DATES
from tests.gate_rule import decision_by_auc_pr
from training.registry import GatePolicy

INGEST, FEATURES, RETRAIN = "ingest_transactions", "build_features", "retrain_fraud_model"


def test_the_demo_runs_the_chain_through_airflow_and_reports_one_json_line(demo_stack):
    summary = demo_stack.summary
    days = [d.isoformat() for d in DEMO_DATES]
    assert summary["status"] == "ok" and summary["mode"] == "airflow" and summary["stack"] == "up"
    assert summary["dates"] == days
    assert 0 < summary["rows_silver"] < summary["rows_written"]  # duplicates and broken rows are removed
    assert summary["rows_quarantined"] > 0 and summary["rows_materialized"] > 0
    assert len(set(summary["dataset_revs"])) == 3

    # Retrain runs that came before the labels matured skip; then one champion and one challenger.
    trained = [r for r in summary["retrains"] if r["decision"] != "skipped"]
    skipped = [r for r in summary["retrains"] if r["decision"] == "skipped"]
    assert [r["as_of"] for r in trained] == days[1:]
    assert all(r["as_of"] < days[1] and "label maturity" in r["reason"] for r in skipped), skipped
    first, second = trained
    assert first["previous_champion"] is None
    assert (first["model_version"], second["model_version"]) == ("1", "2")
    assert second["previous_champion"] == first["champion_version"]  # judged against the first run's outcome
    assert summary["champion_version"] == second["champion_version"]
    # The seeded feed decides: the first model has only the floor (0) to clear; the second beats it by more
    # than the margin on the last day's holdout (AUC-PR 0.017 against 0.003 when measured).
    policy = GatePolicy(floor=float(demo_stack.env["MLOPS_GATE__FLOOR"]))
    assert [r["decision"] for r in trained] == ["promoted", "promoted"], trained
    for retrain in trained:
        by_rule = decision_by_auc_pr(retrain["auc_pr"], retrain["champion_auc_pr"], policy)
        assert retrain["decision"] == by_rule, retrain
        assert retrain["reason"] and retrain["training_set_rev"] and retrain["run_id"]
    assert first["champion_auc_pr"] is None and summary["champion_version"] == "2"

    # The day that arrived last went through the chain on its own: one run of each DAG.
    last = summary["phases"]["one_more_day"]
    assert len(last[FEATURES]) == 1 and len(last[RETRAIN]) == 1
    assert last[RETRAIN][0] == trained[-1]["dag_run_id"]
    assert len(summary["dag_runs"][INGEST]) == 3
    assert set(summary["seconds_per_stage"]) == {"stack", "land", "ingest", "features", "retrain", "scoring"}
    assert all(seconds > 0 for seconds in summary["seconds_per_stage"].values())
    # From the last day's arrival to the gate: the chain's task time and Airflow's overhead around it.
    arrival = summary["arrival_to_model"]
    assert 0 < arrival["busy_seconds"] <= arrival["seconds"]
    assert arrival["overhead_seconds"] == pytest.approx(arrival["seconds"] - arrival["busy_seconds"])
    assert set(arrival["task_seconds_per_stage"]) == {"ingest", "features", "retrain"}
    # Stages run one after another, tasks inside a stage partly in parallel: the union is at most the sum.
    assert arrival["busy_seconds"] <= sum(arrival["task_seconds_per_stage"].values()) + 1e-6
    # the last day was replayed through the scoring service with the champion
    [scored] = summary["scoring"]
    assert scored["date"] == days[-1] and scored["transactions"] > 0 and scored["chargebacks"] >= 0
    assert scored["champion"] == summary["champion_version"]
    assert 0 < scored["latency_ms"]["p50"] <= scored["latency_ms"]["p99"]
    assert 0 <= scored["unknown_entities"] < scored["transactions"]
    # monitoring at work: a drifted copy of the day scored, checked, and the retrain its drift started
    drill = summary["drift_drill"]
    assert drill["drifted_check"]["feature_source"] == "scoring_log"
    assert (
        drill["drifted_scoring"]["drifted"]
        and drill["drifted_scoring"]["transactions"] == scored["transactions"]
    )
    assert drill["drifted_check"]["verdict"] == "drift" and "channel PSI" in drill["drifted_check"]["summary"]
    retrained = drill["retrain"]
    assert retrained["start_reason"].startswith("drift:") and retrained["as_of"] == days[-1]
    # the champion's own training set again (the drifted copy was scored, not ingested), the same code,
    # configuration and image: it would train the champion again, so the run skips training and says why
    assert retrained["training_set_rev"] == second["training_set_rev"]
    assert (retrained["decision"], retrained["model_version"]) == ("skipped", None), retrained
    assert retrained["reason"].startswith("identical to v2 (run "), retrained
    # the human summary went to stderr
    assert "time per stage" in demo_stack.stderr and "make down" in demo_stack.stderr


def test_airflow_recorded_the_chain_as_asset_triggered_runs(demo_stack):
    """Read back from the API: the features and retrain runs were started by asset events, not by hand,
    and each consumed the event of the run before it."""
    client = httpx.Client(
        base_url=f"{demo_stack.airflow_url}/api/v2",
        headers={"Authorization": f"Bearer {demo_stack.token()}"},
        timeout=30,
    )
    runs = demo_stack.summary["dag_runs"]
    with client:
        for run_id in runs[INGEST]:
            run = client.get(f"/dags/{INGEST}/dagRuns/{run_id}").json()
            assert (run["run_type"], run["state"]) == ("backfill", "success")
        for dag_id, source, asset in (
            (FEATURES, INGEST, "silver_transactions"),
            (RETRAIN, FEATURES, "fraud_features"),
        ):
            for run_id in runs[dag_id]:
                run = client.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()
                assert (run["run_type"], run["state"]) == ("asset_triggered", "success")
                events = client.get(f"/dags/{dag_id}/dagRuns/{run_id}/upstreamAssetEvents").json()[
                    "asset_events"
                ]
                assert events and {(e["name"], e["source_dag_id"]) for e in events} == {(asset, source)}
                assert {e["source_run_id"] for e in events} <= set(runs[source])


def test_continue_lands_the_next_day_on_the_running_stack_and_the_gate_decides(demo_stack):
    """`mlops demo --continue`: the day after the demo's last one, through the same stack (already up),
    judged against the demo's champion."""
    mlops = str(Path(sys.executable).with_name("mlops"))
    done = subprocess.run(
        [
            mlops,
            "demo",
            "--continue",
            "--rows-per-day",
            "1500",
            "--epochs",
            "3",
            "--no-drift-drill",
            "--json",
        ],
        env=demo_stack.env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-6000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    next_day = (DEMO_DATES[-1] + timedelta(days=1)).isoformat()
    assert summary["status"] == "ok" and summary["mode"] == "airflow" and summary["dates"] == [next_day]
    assert "already running" in done.stderr  # it did not start a second stack
    assert len(summary["dag_runs"][INGEST]) == 1 and summary["phases"]["history"][FEATURES] == []
    (retrain,) = summary["retrains"]
    assert retrain["as_of"] == next_day
    # the demo's drift drill registered nothing (an identical retrain is skipped): the third version
    assert retrain["previous_champion"] == demo_stack.summary["champion_version"]
    assert int(retrain["model_version"]) == 3
    # On the seeded feed the new day's model does not beat the champion by the margin (both scored AUC-PR 0.0
    # on the new day's holdout when measured): rejected, and the champion stays.
    policy = GatePolicy(floor=float(demo_stack.env["MLOPS_GATE__FLOOR"]))
    expected = decision_by_auc_pr(retrain["auc_pr"], retrain["champion_auc_pr"], policy)
    assert retrain["decision"] == expected == "rejected", retrain
    assert retrain["champion_version"] == retrain["previous_champion"] == summary["champion_version"]
    assert summary["arrival_to_model"]["busy_seconds"] > 0
