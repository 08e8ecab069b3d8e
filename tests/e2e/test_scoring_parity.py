"""Train/serve parity, proven on the demo's lake: the last day's silver transactions replayed through a
running `mlops serve` in event-time order (with the day's chargebacks fed between them) get, for every
transaction, the feature vector of that transaction's row in the training set (integers equal, floats
within 1e-9) and the score the champion gives that row offline."""

from __future__ import annotations

import json
import math
import os
from datetime import date

import numpy as np
import pytest

from core.settings import Settings
from tests.conftest import free_port
from tests.e2e.conftest import DEMO_DATES


@pytest.fixture(scope="module")
def replayed(demo_stack, settings, tmp_path_factory):
    from serving.replay import replay_day, replay_service

    day: date = DEMO_DATES[-1]
    env = {**os.environ, **demo_stack.env}
    log = tmp_path_factory.mktemp("parity") / "serve.log"
    with replay_service(env, day, free_port(), log) as service:
        report = replay_day(service, settings, day)
    return day, report


@pytest.fixture(scope="module")
def settings(demo_stack):
    saved = dict(os.environ)
    os.environ.update(demo_stack.env)
    try:
        yield Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_every_served_feature_vector_equals_its_training_set_row(replayed, settings):
    from features.definitions import INTEGER_FEATURES
    from training.dataset import NUMERIC_FEATURES, build_training_frame

    day, report = replayed
    frame = build_training_frame(
        settings, day, window_days=1, label_maturity_days=0, require_fraud=False
    ).set_index("transaction_id")
    served = {r["transaction_id"]: r for r in report.results}
    both = [tid for tid in served if tid in frame.index]
    # The replay takes the transactions that happened on the day, the training set those that arrived on it:
    # they differ only by late arrivals, a few.
    assert len(both) >= 0.95 * len(served) and len(both) >= 0.95 * len(frame), (
        len(both),
        len(served),
        len(frame),
    )
    assert report.chargebacks > 0, "the day has chargebacks: merchant state moved during the replay"
    mismatches = []
    for tid in both:
        row, features = frame.loc[tid], served[tid]["features"]
        for name in NUMERIC_FEATURES:
            expected, got = row[name], features[name]
            if expected != expected:  # NaN: missing in the training set
                ok = got is None
            elif name in INTEGER_FEATURES:
                ok = got == int(expected)
            else:
                ok = got is not None and math.isclose(got, float(expected), rel_tol=1e-9, abs_tol=1e-9)
            if not ok:
                mismatches.append((tid, name, expected, got))
    assert not mismatches, f"{len(mismatches)} feature values differ, first: {mismatches[:10]}"
    # the replay exercised the features that only stay current because the service keeps state
    recent = [served[tid]["features"]["customer_txn_count_1h"] for tid in both]
    assert sum(1 for v in recent if v) > 0


def test_every_served_score_equals_the_champions_offline_score(replayed, settings):
    from serving.models import ModelSource
    from training.dataset import build_training_frame, model_arrays

    day, report = replayed
    frame = build_training_frame(settings, day, window_days=1, label_maturity_days=0, require_fraud=False)
    versions = {r["model"]["version"] for r in report.results}
    assert len(versions) == 1
    model = ModelSource(settings.mlflow_tracking_uri).load(versions.pop())
    offline = dict(zip(frame["transaction_id"], model.score(model_arrays(frame)[0]), strict=True))
    pairs = np.array(
        [(r["score"], offline[r["transaction_id"]]) for r in report.results if r["transaction_id"] in offline]
    )
    assert len(pairs) >= 0.95 * len(report.results)
    assert np.max(np.abs(pairs[:, 0] - pairs[:, 1])) < 1e-5


def test_batch_scoring_of_the_day_equals_the_replay_through_the_service(replayed, demo_stack, settings):
    """`mlops score --date D` (serving/batch.py: the service's scorer and state in process, no HTTP, silver's
    pseudonyms) decides every transaction of the day as the running service did in the replay."""
    import pyarrow.parquet as pq

    from features.definitions import INTEGER_FEATURES
    from tests.e2e.conftest import mlops_json
    from training.dataset import NUMERIC_FEATURES

    day, report = replayed
    (version,) = {r["model"]["version"] for r in report.results}
    # every decision explained here (the service explains those not approved: the demo's day may have none)
    explain_all = {"MLOPS_SERVING__REASONS": "all"}
    arguments = ("score", "--date", day.isoformat(), "--version", version)
    summary = mlops_json(demo_stack, *arguments, env=explain_all)
    assert summary["status"] == "ok" and summary["model_version"] == version
    assert summary["refused"] == 0 and summary["chargebacks"] == report.chargebacks > 0
    assert summary["transactions"] == summary["scored"] == report.transactions
    rows = {r["transaction_id"]: r for r in pq.read_table(summary["path"]).to_pylist()}
    served = {r["transaction_id"]: r for r in report.results}
    assert rows.keys() == served.keys()
    differ = []
    for tid, answer in served.items():
        row = rows[tid]
        if not math.isclose(row["score"], answer["score"], rel_tol=1e-6, abs_tol=1e-7):
            differ.append((tid, "score", answer["score"], row["score"]))
        elif row["decision"] != answer["decision"] and abs(answer["score"] - answer["threshold"]) > 1e-6:
            differ.append((tid, "decision", answer["decision"], row["decision"]))
        for name in NUMERIC_FEATURES:
            got, expected = row[name], answer["features"][name]
            if got is None or expected is None:
                same = got is None and expected is None
            elif name in INTEGER_FEATURES:
                same = got == expected
            else:
                same = math.isclose(got, expected, rel_tol=1e-9)
            if not same:
                differ.append((tid, name, expected, got))
        assert row["caller"] == "batch" and row["scored_at"] == row["event_timestamp"]
        # reasons (serving/reasons.py): the service explains the decisions not approved, the same inputs as
        # the batch's; the batch explained every one (`input:+effect;...`, largest first, each positive)
        if answer["decision"] != "approve":
            named = [part.split(":")[0] for part in row["reasons"].split(";")]
            assert named == [r["input"] for r in answer["reasons"]], (tid, row["reasons"], answer["reasons"])
        else:
            assert answer["reasons"] is None
        if row["reasons"]:
            effects = [float(part.split(":")[1]) for part in row["reasons"].split(";")]
            assert 0 < len(effects) <= 3 and min(effects) > 0 and effects == sorted(effects, reverse=True)
    assert sum(1 for row in rows.values() if row["reasons"]) > 0.5 * len(rows), "the champion has a baseline"
    assert not differ, f"{len(differ)} values differ from the service's, first: {differ[:10]}"
    # The DAG, as a user starts it from the UI or the REST API (its own run of the stack's scheduler): the
    # same decisions; its rerun replaces the day's file of that version, it does not add to it.
    again = _run_batch_dag(demo_stack, {"date": day.isoformat(), "version": version})
    assert again["path"] == summary["path"] and again["scored"] == summary["scored"]
    table = pq.read_table(again["path"])
    assert table.num_rows == len(rows)
    assert dict(zip(table["transaction_id"].to_pylist(), table["score"].to_pylist(), strict=True)) == {
        tid: row["score"] for tid, row in rows.items()
    }


def _run_batch_dag(demo_stack, conf: dict) -> dict:
    """Unpause score_fraud_batch, start a run with `conf` over Airflow's REST API, wait for it, and return
    what its task returned (its XCom)."""
    import httpx

    from tests.conftest import wait_for

    dag_id = "score_fraud_batch"
    client = httpx.Client(
        base_url=f"{demo_stack.airflow_url}/api/v2",
        headers={"Authorization": f"Bearer {demo_stack.token()}"},
        timeout=30,
    )
    with client:
        assert client.patch(f"/dags/{dag_id}", json={"is_paused": False}).status_code == 200
        started = client.post(f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})
        assert started.status_code == 200, started.text
        run_id = started.json()["dag_run_id"]

        def state() -> str:
            return client.get(f"/dags/{dag_id}/dagRuns/{run_id}").json()["state"]

        wait_for(lambda: state() in ("success", "failed"), 600, f"{dag_id} run {run_id} to end")
        assert state() == "success", client.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").text
        answer = client.get(f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/score/xcomEntries/return_value")
        assert answer.status_code == 200, answer.text
        value = answer.json()["value"]
        return value if isinstance(value, dict) else json.loads(value)
