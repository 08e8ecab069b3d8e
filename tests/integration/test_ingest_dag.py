"""The ingest DAG through real Airflow (dag.test): the happy path emits the silver asset; a failed GX
expectation fails validate_bronze, and silver is never built."""

from __future__ import annotations

import asyncio
from datetime import date

import pendulum
import pytest

from core.errors import DataValidationError
from core.settings import get_settings
from pipelines.ingest import job
from pipelines.lake import Tables
from pipelines.synthetic.landing import GenerateRequest, generate_landing
from tests.integration.conftest import dag_run_states


def _land(day: date, rows: int) -> None:
    generate_landing(
        GenerateRequest(
            start=day,
            days=1,
            rows_per_day=rows,
            seed=9,
            landing=get_settings().landing,
            feed_start=date(2026, 1, 5),
        )
    )


@pytest.fixture
def ingest_dag(airflow_db):
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder="dags").dags["ingest_transactions"]


def test_a_run_ingests_its_date_and_emits_the_silver_asset(ingest_dag, spark):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    _land(date(2026, 1, 5), 1200)
    run = ingest_dag.test(logical_date=pendulum.datetime(2026, 1, 6, tz="UTC"))
    assert dag_run_states(run) == {
        t: "success"
        for t in (
            "wait_for_arrival",
            "ingest_labels",
            "ingest_to_bronze",
            "validate_bronze",
            "build_silver",
            "validate_silver",
        )
    }
    tables = Tables(get_settings().lake)
    assert Tables.partition(tables.silver, date(2026, 1, 5)).is_dir()
    with create_session() as session:
        events = (
            session.query(AssetEvent)
            .join(AssetModel, AssetEvent.asset_id == AssetModel.id)
            .filter(AssetModel.name == "silver_transactions", AssetEvent.source_run_id == run.run_id)
            .count()
        )
    assert events == 1


def test_a_failed_expectation_fails_validate_bronze_and_stops_the_run(ingest_dag, spark):
    settings = get_settings()
    _land(date(2026, 1, 5), 1500)
    job.ingest(settings, date(2026, 1, 5), "previous-day")
    _land(date(2026, 1, 6), 300)  # a fifth of yesterday: below the 0.5x row-count bound
    run = ingest_dag.test(logical_date=pendulum.datetime(2026, 1, 7, tz="UTC"))
    states = dag_run_states(run)
    assert states["ingest_to_bronze"] == "success"
    assert states["validate_bronze"] == "failed"
    assert states["build_silver"] == states["validate_silver"] == "upstream_failed"
    assert not Tables.partition(Tables(settings.lake).silver, date(2026, 1, 6)).exists()

    with pytest.raises(DataValidationError) as error:
        job.validate_bronze(settings, date(2026, 1, 6))
    message = str(error.value)
    assert "expect_table_row_count_to_be_between on the table: observed 291" in message
    assert "'min_value': 720" in message and "Data docs: file://" in message
    docs = message.rsplit("Data docs: file://", 1)[1].strip()
    assert docs.endswith("index.html") and str(settings.home) in docs


def test_the_arrival_sensor_defers_until_the_marker_appears(tmp_path):
    from airflow.sdk.exceptions import TaskDeferred

    from orchestration.tasks import ArrivalSensor

    sensor = ArrivalSensor(task_id="wait", arrival_date="2026-02-01", poke_interval=0.05)
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    trigger = deferred.value.trigger
    marker = get_settings().landing / "2026-02-01" / "_SUCCESS"
    assert trigger.filepath == str(marker)

    async def first_event():
        runner = trigger.run()
        waiting = asyncio.ensure_future(runner.__anext__())
        await asyncio.sleep(0.2)
        assert not waiting.done()  # nothing landed yet
        marker.parent.mkdir(parents=True)
        marker.touch()
        return await asyncio.wait_for(waiting, timeout=5)

    assert asyncio.run(first_event()).payload is True
    assert sensor.execute(context={}) == str(marker)  # once landed, it returns without deferring
