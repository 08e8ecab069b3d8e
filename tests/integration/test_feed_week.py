"""A week of a real feed through the real features and retrain DAGs (dag.test: real Airflow, Spark, GX, DVC,
Feast, MLflow, torch), from where the reference lake (tests/lake.py) stands after every date's first arrival:
events a day late, a date delivered after the next one, quarantined rows, and a date whose chargebacks have
not come yet. From there the DAGs run what the week has left: a retrain states which label date it lacks,
the chargebacks arrive, and a date is re-delivered with rows withdrawn. Every features run succeeds, and at
the end gold equals a rebuild from scratch, is byte for byte the gold the reference lake's build reached
through the same steps run by `mlops` (the chain), and the online store holds each entity's latest gold row.

The first arrivals' plans (a late date rebuilding the next one, late events rebuilding the date they touch)
are the same `plan_gold` the DAG's first task runs: tests/integration/test_late_events.py holds them on the
lake's record; tests/integration/test_features_dag.py holds a first arrival's run through the DAG.
"""

from __future__ import annotations

import json
import shutil
from datetime import date

import pytest

from core.settings import Settings, get_settings
from pipelines.ingest import job as ingest
from pipelines.lake import Tables, read_json
from tests import lake as reference
from tests.integration.gold_checks import (
    assert_gold_is_a_rebuild_from_scratch,
    assert_online_holds_latest_gold,
    counts_by_event_date,
    gold_digests,
    gold_tables,
    silver_by_event_date,
)

DAYS = reference.DAYS
UNLABELLED = reference.UNLABELLED  # its chargebacks file comes after the other arrivals
REDELIVERED = reference.REDELIVERED  # delivered again at the end with its last rows withdrawn


def _states(dag_id: str, run_id: str) -> dict[tuple[str, str | None], str]:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return {
            (ti.task_id, ti.rendered_map_index): str(ti.state)
            for ti in session.query(TaskInstance).filter(
                TaskInstance.run_id == run_id, TaskInstance.dag_id == dag_id
            )
        }


def _xcom(dag_id: str, run_id: str, task_id: str):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        value = (
            session.query(XComModel.value)
            .filter(
                XComModel.dag_id == dag_id,
                XComModel.run_id == run_id,
                XComModel.task_id == task_id,
                XComModel.key == "return_value",
            )
            .scalar()
        )
    return json.loads(value) if isinstance(value, str) else value


def _features_run(dag, day: date) -> list[str]:
    """One features DAG run for an arrival; every task must succeed. Returns the event dates it built."""
    run = dag.test(run_conf={"arrival_date": day.isoformat()})
    states = _states("build_features", run.run_id)
    assert set(states.values()) == {"success"}, (day, states)
    return _xcom("build_features", run.run_id, "plan_gold")


def _assert_reconciled(settings: Settings, day: date) -> None:
    record = read_json(Tables(settings.lake).reconciliation(day))
    assert record is not None, day
    assert record["rows_in"] == record["rows_bronze"] + record["rows_quarantined"], record
    assert record["rows_silver"] + record["duplicates_removed"] == record["rows_bronze"], record


@pytest.fixture
def week_settings(airflow_db, spark, monkeypatch, tmp_path):
    """The reference lake after every date's first arrival, copied: the installation the DAGs run on."""
    phase = reference.reference_lake(tmp_path / "home", phase="arrivals")
    # The end state this copy's build reached, read now: a build for other code (another checkout on this
    # machine) may replace the cache while the week runs, and a lake built again has other pseudonyms.
    end_digests = gold_digests(Settings(home=reference.cached_lake()[0]))
    monkeypatch.setenv("MLOPS_HOME", str(phase.home))
    monkeypatch.setenv("MLOPS_TRAINING__EPOCHS", "2")
    monkeypatch.setenv("MLOPS_TRAINING__LABEL_MATURITY_DAYS", "1")
    monkeypatch.setenv("MLOPS_TRAINING__WINDOW_DAYS", str(len(DAYS)))
    get_settings.cache_clear()
    return get_settings(), phase.events, end_digests


def test_a_week_of_late_out_of_order_redelivered_and_partially_labelled_arrivals(week_settings, tmp_path):
    from airflow.dag_processing.dagbag import DagBag

    settings, events, end_digests = week_settings
    delivered = [date.fromisoformat(d) for d in events["delivered"]]
    assert delivered != sorted(delivered), "the lake's feed must hold an out-of-order delivery"
    assert events["late_rows"] > 0 and events["quarantined_rows"] > 0, events
    for day in DAYS:
        _assert_reconciled(settings, day)
    held = settings.home / "held-labels"
    assert any(held.iterdir()) and not any((settings.landing / UNLABELLED.isoformat()).glob("labels-*"))

    bag = DagBag(dag_folder="dags")
    features, retrain = bag.dags["build_features"], bag.dags["retrain_fraud_model"]
    # A retrain's training set now runs on the labels known so far, and says which date had none (the
    # training set and what it needs; train, the gate and the export: tests/integration/test_retrain_dag).
    subset = retrain.partial_subset(["training_set"], include_upstream=True, include_downstream=False)
    assert "train" not in subset.task_dict and "training_set" in subset.task_dict
    run = subset.test(run_conf={"as_of": DAYS[-1].isoformat()})
    states = _states("retrain_fraud_model", run.run_id)
    assert states[("training_set", None)] == "success", states
    used = _xcom("retrain_fraud_model", run.run_id, "training_set")
    assert used["labels_reported_through"] == DAYS[-1].isoformat()
    assert used["label_arrivals_missing"] == [UNLABELLED.isoformat()]

    # The chargebacks arrive; the producer re-delivers a date with its last rows withdrawn.
    for labels in held.iterdir():
        shutil.move(labels, settings.landing / UNLABELLED.isoformat() / labels.name)
    ingest.ingest_labels(settings, UNLABELLED, "week:labels")
    assert _features_run(features, UNLABELLED), "late chargebacks change the merchants' gold"
    data = sorted((settings.landing / REDELIVERED.isoformat()).glob("transactions-*"))[-1]
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[: -reference.WITHDRAWN]))
    ingest.ingest(settings, REDELIVERED, "week:redelivered")
    _assert_reconciled(settings, REDELIVERED)
    rebuilt = _features_run(features, REDELIVERED)
    assert rebuilt[-1] == DAYS[-1].isoformat(), "every later date read the re-delivered one"

    silver = silver_by_event_date(settings)
    assert counts_by_event_date(gold_tables(settings)[0]) == silver
    assert counts_by_event_date(gold_tables(settings)[1]) == silver
    assert_gold_is_a_rebuild_from_scratch(settings, tmp_path)
    # The same arrivals through the chain's steps (the reference lake's build) reached the same gold.
    assert gold_digests(settings) == end_digests
    assert_online_holds_latest_gold(settings)
