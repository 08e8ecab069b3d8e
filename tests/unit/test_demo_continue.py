"""`mlops demo --continue` picks the day after the feed already landed, and says what to do when none is; and
the demo reads a build_features run of several dates back per map index (no Airflow: a fake API answering
the client's models)."""

from __future__ import annotations

from datetime import date

import pytest

from core.settings import Settings
from mlops.demo import DemoError, next_arrival


def test_the_next_arrival_is_the_day_after_the_last_landed_one(tmp_path):
    settings = Settings(home=tmp_path)
    for name in ("2026-01-03", "2026-01-01", "2026-01-02", "_tmp", "notes"):
        (settings.landing / name).mkdir(parents=True)
    assert next_arrival(settings) == (date(2026, 1, 1), date(2026, 1, 4))


def test_continuing_an_empty_home_names_the_landing_zone_and_what_to_run(tmp_path):
    settings = Settings(home=tmp_path)
    with pytest.raises(DemoError, match=r"nothing landed under .*landing.*run `mlops demo`"):
        next_arrival(settings)
    settings.landing.mkdir(parents=True)
    with pytest.raises(DemoError, match="nothing landed"):
        next_arrival(settings)


# Reading a build_features run back through the REST API: build_gold, validate_gold and materialize are
# mapped over the run's dates (one task instance and one XCom per map index), version_gold is not.
FEATURES_RUN = "asset_triggered__2026-01-03"
DAYS = ["2026-01-02", "2026-01-03"]


class FakeAPI:
    """The answers of mlops.airflow_api.AirflowAPI for one features run of two dates (the client's models)."""

    base_url = "http://airflow"

    def __init__(self, failed_index: int | None = None) -> None:
        from airflow_client.client import TaskInstanceResponse, TaskInstanceState

        def ti(task_id: str, map_index: int = -1, seconds: float = 1.0):
            failed = failed_index is not None and map_index == failed_index and task_id == "build_gold"
            return TaskInstanceResponse.model_construct(
                task_id=task_id,
                map_index=map_index,
                rendered_map_index=DAYS[map_index] if map_index >= 0 else None,
                state=TaskInstanceState.FAILED if failed else TaskInstanceState.SUCCESS,
                duration=seconds,
            )

        mapped = [
            ti(t, i, 10.0 * (i + 1)) for t in ("build_gold", "validate_gold", "materialize") for i in (0, 1)
        ]
        self.instances = [ti("dates_to_compute"), ti("plan_gold"), *mapped, ti("version_gold", seconds=5.0)]
        self.xcoms = {
            ("dates_to_compute", -1): DAYS,
            ("plan_gold", -1): DAYS,
            ("version_gold", -1): [{"dataset_rev": f"rev-{day}"} for day in DAYS],
            **{
                ("build_gold", i): {"rows_customer_features": i + 1, "rows_merchant_features": 10}
                for i in (0, 1)
            },
            **{("materialize", i): {"rows_materialized": 100 * (i + 1)} for i in (0, 1)},
        }

    def xcom(self, dag_id, run_id, task_id, key="return_value", map_index=-1):
        if dag_id == "ingest_transactions":
            day = run_id.removeprefix("backfill__")
            return {"arrival_date": day, "rows_in": 5, "rows_quarantined": 1, "rows_silver": 4}
        assert (dag_id, run_id, key) == ("build_features", FEATURES_RUN, "return_value")
        return self.xcoms[(task_id, map_index)]

    def task_instances(self, dag_id, run_id):
        return self.instances

    def dag_run(self, dag_id, run_id):
        from airflow_client.client import DAGRunResponse

        return DAGRunResponse.model_construct(dag_run_id=run_id, duration=80.0)

    def wait_for_run(self, dag_id, run_id, deadline):
        from airflow_client.client import DAGRunResponse, DagRunState

        return DAGRunResponse.model_construct(dag_run_id=run_id, state=DagRunState.FAILED)


def test_a_features_run_of_several_dates_gives_each_date_its_own_map_index():
    from mlops.demo import _daily_rows

    runs = {"ingest_transactions": [f"backfill__{day}" for day in DAYS], "build_features": [FEATURES_RUN]}
    daily = _daily_rows(FakeAPI(), runs)
    assert [(d["date"], d["rows_gold"], d["dataset_rev"], d["rows_materialized"]) for d in daily] == [
        ("2026-01-02", 11, "rev-2026-01-02", 100),
        ("2026-01-03", 12, "rev-2026-01-03", 200),
    ]


def test_task_seconds_count_every_map_index_and_a_failed_one_is_named_by_its_date():
    from mlops.demo import _finished_ok, _run_timings

    timings = _run_timings(FakeAPI(), "build_features", [FEATURES_RUN])
    assert timings == {"runs": 1, "task_seconds": 2 * 1.0 + 3 * (10.0 + 20.0) + 5.0, "run_seconds": 80.0}
    with pytest.raises(DemoError, match=r"failed at task build_gold\[2026-01-03\];"):
        _finished_ok(FakeAPI(failed_index=1), "build_features", FEATURES_RUN, deadline=0)
