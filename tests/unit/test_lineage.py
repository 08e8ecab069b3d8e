"""core/lineage.py: the events it writes are the OpenLineage client's own JSON (a contract test against the
client's classes and serializer), each step run sends START then COMPLETE or FAIL, and a consumer that is
down or a dataset description that fails never fails the step."""

from __future__ import annotations

import json
import uuid
from datetime import date
from pathlib import Path

import pytest

from core import lineage
from core.settings import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


def _events(settings: Settings) -> list[dict]:
    return lineage.read_events(settings, (lineage.START, lineage.COMPLETE, lineage.FAIL))


def test_an_event_is_the_json_the_openlineage_client_writes_for_the_same_run(settings, monkeypatch):
    from openlineage.client import event_v2 as ol
    from openlineage.client.generated import (
        data_quality_assertions_dataset as dq,
    )
    from openlineage.client.generated import (
        dataset_version_dataset,
        error_message_run,
        job_type_job,
        output_statistics_output_dataset,
        parent_run,
    )
    from openlineage.client.generated.base import RunFacet
    from openlineage.client.serde import Serde

    monkeypatch.setenv(lineage.AIRFLOW_DAG, "ingest_transactions")
    monkeypatch.setenv(lineage.AIRFLOW_RUN, "manual__2026-03-02")
    suite = {
        "suite": "bronze_transactions",
        "assertions": [
            {"expectation": "expect_column_values_to_not_be_null", "column": "amount", "success": True},
            {"expectation": "expect_table_row_count_to_be_between", "column": None, "success": False},
        ],
    }
    partition = settings.lake / "bronze" / "arrival_date=2026-03-02"
    read = lineage.validated(lineage.path(partition), suite)
    written = lineage.path(settings.lake / "silver" / "arrival_date=2026-03-02", rows=42, version="ab12")
    facts = {"rows_silver": 42, "status": "silver"}
    run_id = str(uuid.uuid4())
    error = lineage._error(ValueError("column 'amount': 'x' is not a number"))
    ours = lineage.event(
        settings,
        "build_silver",
        run_id,
        lineage.COMPLETE,
        lineage.Datasets([read], [written]),
        {**lineage._mlops(facts), **error},
    )

    # The same run through the client's classes: its producer set on each facet as ours is.
    def made(cls, **fields):
        return cls(**fields, producer=lineage.PRODUCER)

    @__import__("attr").define
    class MlopsFacet(RunFacet):
        rows_silver: int = 0
        status: str = ""

        @staticmethod
        def _get_schema() -> str:
            return lineage.RUN_FACET_SCHEMA

    theirs = ol.RunEvent(
        eventType=ol.RunState.COMPLETE,
        eventTime=ours["eventTime"],
        producer=lineage.PRODUCER,
        run=ol.Run(
            runId=run_id,
            facets={
                "parent": made(
                    parent_run.ParentRunFacet,
                    run=parent_run.Run(runId=ours["run"]["facets"]["parent"]["run"]["runId"]),
                    job=parent_run.Job(namespace="airflow", name="ingest_transactions"),
                ),
                lineage.RUN_FACET: made(MlopsFacet, **facts),
                "errorMessage": made(
                    error_message_run.ErrorMessageRunFacet,
                    message="column 'amount': 'x' is not a number",
                    programmingLanguage="python",
                    stackTrace=error["errorMessage"]["stackTrace"],
                ),
            },
        ),
        job=ol.Job(
            namespace="mlops-fraud",
            name="build_silver",
            facets={
                "jobType": made(
                    job_type_job.JobTypeJobFacet, processingType="BATCH", integration="MLOPS", jobType="TASK"
                )
            },
        ),
        inputs=[
            ol.InputDataset(
                namespace="file",
                name=str(partition.absolute()),
                inputFacets={
                    "dataQualityAssertions": made(
                        dq.DataQualityAssertionsDatasetFacet,
                        assertions=[
                            dq.Assertion(
                                assertion="expect_column_values_to_not_be_null",
                                success=True,
                                column="amount",
                                name="bronze_transactions",
                            ),
                            dq.Assertion(
                                assertion="expect_table_row_count_to_be_between",
                                success=False,
                                name="bronze_transactions",
                            ),
                        ],
                    )
                },
            )
        ],
        outputs=[
            ol.OutputDataset(
                namespace="file",
                name=str(written.name),
                facets={
                    "version": made(dataset_version_dataset.DatasetVersionDatasetFacet, datasetVersion="ab12")
                },
                outputFacets={
                    "outputStatistics": made(
                        output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet, rowCount=42
                    )
                },
            )
        ],
    )
    expected = Serde.to_dict(theirs)
    for assertion in expected["inputs"][0]["inputFacets"]["dataQualityAssertions"]["assertions"]:
        assertion.pop("params")  # the client writes an empty `params` the schema does not ask for
    assert json.loads(json.dumps(ours)) == expected


def test_a_step_sends_start_then_complete_with_what_it_read_and_wrote(settings):
    source, target = settings.home / "in.csv", settings.home / "out"

    @lineage.emits(
        "copy", lambda s, record, day: lineage.Datasets([lineage.path(source)], [lineage.path(target)])
    )
    def copy(s: Settings, day: date) -> dict:
        return {"rows": 3, "day": day.isoformat(), "nested": {"left": "out"}}

    assert copy(settings, date(2026, 3, 2)) == {"rows": 3, "day": "2026-03-02", "nested": {"left": "out"}}
    start, complete = _events(settings)
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert start["run"]["runId"] == complete["run"]["runId"] and start["job"]["name"] == "copy"
    assert [d["name"] for d in complete["inputs"]] == [str(source)]
    assert [d["name"] for d in complete["outputs"]] == [str(target)]
    facet = complete["run"]["facets"][lineage.RUN_FACET]
    assert facet["rows"] == 3 and facet["day"] == "2026-03-02" and "nested" not in facet


def test_a_failing_step_sends_fail_with_its_error_and_still_raises(settings):
    @lineage.emits("broken", lambda s, record: lineage.Datasets())
    def broken(s: Settings) -> dict:
        raise RuntimeError("the disk is full")

    with pytest.raises(RuntimeError, match="the disk is full"):
        broken(settings)
    start, fail = _events(settings)
    assert fail["eventType"] == "FAIL" and fail["run"]["runId"] == start["run"]["runId"]
    assert fail["run"]["facets"]["errorMessage"]["message"] == "the disk is full"
    assert "RuntimeError" in fail["run"]["facets"]["errorMessage"]["stackTrace"]


def test_a_description_that_fails_is_logged_and_the_step_completes(settings, caplog):
    def wrong(s: Settings, record: dict) -> lineage.Datasets:
        raise KeyError("files")

    @lineage.emits("step", wrong)
    def step(s: Settings) -> dict:
        return {"done": True}

    assert step(settings) == {"done": True}
    complete = _events(settings)[-1]
    assert complete["eventType"] == "COMPLETE" and complete["inputs"] == [] and complete["outputs"] == []
    assert "datasets not described" in complete["run"]["facets"][lineage.RUN_FACET]["lineage_error"]
    assert "the datasets of step could not be described" in caplog.text


def test_events_go_to_the_consumer_too_and_a_consumer_that_is_down_fails_nothing(settings, caplog):
    from tests.receivers import AlertReceiver

    receiver = AlertReceiver()
    consumer = receiver.webhook_url.rsplit("/hooks", 1)[0]  # the receiver takes posts on any path
    lineage._paused_until[0] = 0.0
    posted = settings.model_copy(update={"lineage": settings.lineage.model_copy(update={"url": consumer})})

    @lineage.emits("step", lambda s, record: lineage.Datasets(outputs=[lineage.path(s.home / "out")]))
    def step(s: Settings) -> dict:
        return {}

    step(posted)
    receiver.close()
    with receiver.received.lock:
        kinds = [p["eventType"] for p in receiver.received.posts]
        paths = list(receiver.received.paths)
    assert kinds == ["START", "COMPLETE"] and paths == ["/api/v1/lineage"] * 2
    assert receiver.received.posts == [e for e in _events(settings)]  # the same events as the files

    step(posted)  # the consumer is gone: the step runs, the files are written, the loss is logged
    assert len(_events(settings)) == 4
    assert "was not accepted by" in caplog.text  # START: tried (with its retries), failed
    assert "not posted (the consumer failed less than 60 s ago)" in caplog.text  # COMPLETE: not tried


def test_the_scoring_log_announces_each_date_and_version_once_within_its_bound(settings):
    from serving.scoring_log import DayLineage

    announce = DayLineage(settings)
    root = settings.scoring_log_dir
    announce(root, date(2026, 3, 2), {"2", "3"})
    announce(root, date(2026, 3, 2), {"2"})  # already announced: nothing sent
    announce(root, date(2026, 3, 3), {"2"})
    events = _events(settings)
    assert [
        (e["job"]["name"], [d["name"] for d in e["inputs"]], e["outputs"][0]["name"]) for e in events
    ] == [
        (
            "score",
            ["models/fraud-detector/versions/2", "models/fraud-detector/versions/3"],
            str(root / "date=2026-03-02"),
        ),
        ("score", ["models/fraud-detector/versions/2"], str(root / "date=2026-03-03")),
    ]
    announce.MAX_PAIRS = 3
    announce(root, date(2026, 3, 4), {"2"})  # past the bound: forgets, then remembers only the new pair
    assert len(announce._seen) == 1
