"""The features DAG through real Airflow (dag.test) on real Spark, GX, DVC and Feast (SQLite online store),
and `mlops features --json` running the same steps."""

from __future__ import annotations

import json
import os
import shutil
from datetime import date, timedelta

import pytest

from core.settings import Settings, get_settings
from pipelines.ingest import job as ingest
from pipelines.synthetic.landing import GenerateRequest, generate_landing
from tests.integration.conftest import dag_run_states
from tests.lake import _link_tree

FIRST = date(2026, 1, 5)
LAST = FIRST + timedelta(days=2)


@pytest.fixture(scope="module")
def silver_built(spark, tmp_path_factory):
    """Three days through bronze, silver and labels, once for the module (about a minute of Spark)."""
    settings = Settings(home=tmp_path_factory.mktemp("features-dag") / "home")
    settings.ensure_dirs()
    generate_landing(
        GenerateRequest(
            start=FIRST,
            days=3,
            rows_per_day=800,
            seed=31,
            landing=settings.landing,
            customers=80,
            merchants=40,
        )
    )
    for offset in range(3):
        day = FIRST + timedelta(days=offset)
        ingest.ingest_to_bronze(settings, day, "t")
        ingest.build_silver(settings, day, "t")
        ingest.ingest_labels(settings, day, "t")
    return settings.home


@pytest.fixture
def silver_days(silver_built):
    """The module's three silver days as this test's own installation: a copy (tests/lake.py `_link_tree`:
    Parquet hard-linked, the rest copied with the built home's path replaced)."""
    settings = get_settings()
    shutil.rmtree(settings.home, ignore_errors=True)
    _link_tree(silver_built, settings.home, str(silver_built))
    return settings


def test_a_run_builds_versions_and_materializes_the_date(airflow_db, silver_days, spark):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.session import create_session

    dag = DagBag(dag_folder="dags").dags["build_features"]
    niceness_before = os.getpriority(os.PRIO_PROCESS, 0)
    run = dag.test(run_conf={"arrival_date": LAST.isoformat()})
    states = dag_run_states(run)
    assert set(states.values()) == {"success"}, states
    # The online load ran at the settings' lower CPU priority (beside the retrain, it yields the cores),
    # and a task run in this process (dag.test) put this thread's priority back.
    from airflow.models.xcom import XComModel

    with create_session() as session:
        loaded = (
            session.query(XComModel.value)
            .filter(XComModel.run_id == run.run_id, XComModel.task_id == "materialize")
            .filter(XComModel.key == "return_value")
            .one()[0]
        )
    loaded = json.loads(loaded) if isinstance(loaded, str) else loaded
    assert loaded["niceness"] == niceness_before + 10 and loaded["rows_materialized"] > 0
    assert os.getpriority(os.PRIO_PROCESS, 0) == niceness_before
    # Versioned gold starts the retrain (fraud_features); the online load is its own asset, beside it.
    from airflow.models.asset import AssetEvent, AssetModel

    with create_session() as session:
        events = {
            name: (task_id, extra)
            for name, task_id, extra in session.query(
                AssetModel.name, AssetEvent.source_task_id, AssetEvent.extra
            )
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .filter(AssetEvent.source_run_id == run.run_id)
        }
    assert events == {
        "fraud_features": ("version_gold", {"event_dates": [LAST.isoformat()]}),
        "fraud_features_online": ("materialize", {"event_dates": [LAST.isoformat()]}),
    }
    assert "materialize" not in dag.task_dict["version_gold"].upstream_task_ids
    assert dag.task_dict["materialize"].upstream_task_ids == {"validate_gold", "plan_gold"}
    # The retrain starts on fraud_features: the training rows it reads are built by then.
    assert "build_training_rows" in dag.task_dict["version_gold"].upstream_task_ids
    assert (silver_days.lake / "training_rows" / f"event_date={LAST.isoformat()}").is_dir()

    from features.online import online_features

    gold = spark.read.parquet(str(silver_days.lake / "gold" / "customer_features")).where(
        f"event_date = '{LAST}'"
    )
    latest = gold.orderBy("event_timestamp", ascending=False).first()
    online = online_features(silver_days, [{"customer_id": latest.customer_id, "merchant_id": "m000000"}])
    same_customer = (
        gold.where(f"customer_id = '{latest.customer_id}'")
        .orderBy("event_timestamp", ascending=False)
        .first()
    )
    assert online["customer_txn_count_24h"][0] == same_customer.customer_txn_count_24h


def test_each_date_of_a_run_is_its_own_task_instances_and_fails_alone(airflow_db, silver_days):
    """A run over two dates, one of which has no silver: that date's build_gold fails (at once, no retry),
    the other date goes through to the online store, and versioning, which needs every date, does not run."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    missing = LAST + timedelta(days=30)
    dag = DagBag(dag_folder="dags").dags["build_features"]
    run = dag.test(run_conf={"arrival_date": f"{missing}, {LAST}"})
    with create_session() as session:
        states = {
            (ti.task_id, ti.rendered_map_index): str(ti.state)
            for ti in session.query(TaskInstance).filter(
                TaskInstance.run_id == run.run_id, TaskInstance.dag_id == "build_features"
            )
        }
    day, gone = LAST.isoformat(), missing.isoformat()
    assert states == {
        ("dates_to_compute", None): "success",
        ("plan_gold", None): "success",
        ("build_gold", day): "success",
        ("validate_gold", day): "success",
        ("materialize", day): "success",
        ("build_gold", gone): "failed",
        # never run, so never named: the grid shows their index (dates are sorted, the missing one is 2nd)
        ("validate_gold", "1"): "upstream_failed",
        ("materialize", "1"): "upstream_failed",
        ("build_training_rows", None): "upstream_failed",
        ("version_gold", None): "upstream_failed",
    }
    assert (silver_days.lake / "gold" / "customer_features" / f"event_date={day}").is_dir()


def test_cli_features_prints_the_dataset_revision_and_rows_then_a_backfill_rebuilds_only_what_is_stale(
    airflow_db, silver_days, monkeypatch
):
    """`mlops features --json`, in the test's process (its Spark session: no second JVM to start); then, on
    the gold it built, the backfill from the command line and from the DAG's `backfill` param: nothing while
    every date is built for today's declarations, and the date alone once its record says other ones."""
    from typer.testing import CliRunner

    from mlops.cli import app

    monkeypatch.setenv("MLOPS_HOME", str(silver_days.home))
    monkeypatch.setenv("MLOPS_SPARK_DRIVER_MEMORY", "1g")
    get_settings.cache_clear()
    done = CliRunner().invoke(app, ["features", "--date", LAST.isoformat(), "--json"])
    assert done.exit_code == 0, done.output[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and len(summary["dataset_rev"]) == 16
    assert summary["rows_gold"] == summary["rows_customer_features"] * 2 > 0
    assert summary["rows_materialized"] > 0
    steps = summary["seconds_per_step"]
    assert set(steps) == {
        "plan_gold", "build_gold", "validate_gold", "version_gold", "materialize", "build_training_rows"
    }  # fmt: skip
    assert all(seconds > 0 for seconds in steps.values())

    # The backfill, with every date up to date: nothing from the command line, a skipped plan in the DAG (no
    # build, no version, so no retrain is started).
    done = CliRunner().invoke(app, ["features", "backfill", "--json"])
    assert done.exit_code == 0, done.output[-3000:]
    nothing = json.loads(done.stdout.strip().splitlines()[-1])
    assert nothing["status"] == "ok" and nothing["rebuilt"] == {} and nothing["plan"]["event_dates"] == []
    assert "nothing to do" in done.stderr
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.asset import AssetEvent

    dag = DagBag(dag_folder="dags").dags["build_features"]
    idle = dag_run_states(dag.test(run_conf={"backfill": True}))
    assert idle["dates_to_compute"] == "success" and idle["plan_gold"] == "skipped", idle
    assert {idle["version_gold"], idle["build_training_rows"], idle["build_gold"]} == {"skipped"}, idle

    # The date's gold as built for other declarations (a feature added since): the DAG's backfill rebuilds it.
    from pipelines.gold.contract import FEATURES_FORMAT, build_path

    record_path = build_path(silver_days.lake, LAST)
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "features": "declared-before"}))
    run = dag.test(run_conf={"backfill": True})
    states = dag_run_states(run)
    assert set(states.values()) == {"success"}, states
    assert json.loads(record_path.read_text())["features"] == FEATURES_FORMAT
    from airflow.utils.session import create_session

    with create_session() as session:
        extras = [e.extra for e in session.query(AssetEvent).filter(AssetEvent.source_run_id == run.run_id)]
    assert {"event_dates": [LAST.isoformat()]} in extras, extras
