"""The worked example of docs/data-engineers.md through real Airflow (dag.test) on real ingest output: the
report it writes matches what quarantine holds, by reason; a date never ingested fails the report task."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import pytest

from core.settings import get_settings
from pipelines.ingest import job
from pipelines.lake import Tables
from pipelines.synthetic.faults import parse_faults
from pipelines.synthetic.landing import GenerateRequest, generate_landing
from tests.integration.conftest import dag_run_states

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples"
DAY = date(2026, 1, 5)


def _map_labels(run) -> dict[str, list[str]]:
    """The names the grid shows for each mapped task's instances."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter(
            TaskInstance.run_id == run.run_id, TaskInstance.dag_id == run.dag_id, TaskInstance.map_index >= 0
        )
        return {ti.task_id: [ti.rendered_map_index] for ti in rows}


@pytest.fixture
def example_dag(airflow_db, tmp_path, monkeypatch):
    """The example as a deployment would have it: alone in a DAG folder, its module importable."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.syspath_prepend(str(EXAMPLES))
    folder = tmp_path / "dags"
    folder.mkdir()
    shutil.copy(EXAMPLES / "dags" / "example_quarantine_report.py", folder)
    # dag.test runs what the configured DAG bundles hold: add the folder as a bundle beside dags/.
    local = "airflow.dag_processing.bundles.local.LocalDagBundle"
    bundles = [
        {"name": "dags-folder", "classpath": local, "kwargs": {}},
        {"name": "worked-example", "classpath": local, "kwargs": {"path": str(folder)}},
    ]
    monkeypatch.setenv("AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST", json.dumps(bundles))
    dagbag = DagBag(dag_folder=str(folder))
    assert dagbag.import_errors == {}
    return dagbag.dags["example_quarantine_report"]


def test_a_run_reports_what_quarantine_holds_by_reason(example_dag, spark):
    from pyspark.sql import functions as F

    settings = get_settings()
    faults = "malformed=0.01,wrong_type=0.005,out_of_range=0.005,duplicates=0.02"
    generate_landing(
        GenerateRequest(
            start=DAY, days=1, rows_per_day=600, seed=5, landing=settings.landing, faults=parse_faults(faults)
        )
    )
    job.ingest_to_bronze(settings, DAY, "t")
    job.build_silver(settings, DAY, "t")

    run = example_dag.test(run_conf={"arrival_date": DAY.isoformat()})
    assert dag_run_states(run) == {"dates_to_report": "success", "report_quarantine": "success"}
    assert _map_labels(run) == {"report_quarantine": [DAY.isoformat()]}  # the date, not "0"

    report = json.loads((settings.lake / "reports" / "quarantine" / f"arrival_date={DAY}.json").read_text())
    quarantine = spark.read.parquet(str(Tables(settings.lake).quarantine)).where(
        F.col("arrival_date") == F.lit(DAY)
    )
    held = {row["reason"]: row["count"] for row in quarantine.groupBy("reason").count().collect()}
    assert report["by_reason"] == held
    assert {"duplicate", "malformed"} <= set(held)
    assert report["rows_quarantined"] == sum(held.values())
    assert report["rows_in"] == json.loads(Tables(settings.lake).reconciliation(DAY).read_text())["rows_in"]


def test_a_date_never_ingested_fails_the_report_task_at_once(example_dag, capsys):
    run = example_dag.test(run_conf={"arrival_date": "2026-02-01"})
    assert dag_run_states(run) == {"dates_to_report": "success", "report_quarantine": "failed"}
    # failed, not up for retry: a data problem is not retried, and the log says what to do
    assert "arrival 2026-02-01 has no reconciliation record at" in capsys.readouterr().out
    assert not (get_settings().lake / "reports").exists()
