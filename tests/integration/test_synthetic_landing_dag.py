"""The synthetic landing DAG runs through real Airflow (dag.test) and lands what the CLI would."""

from __future__ import annotations

import hashlib

import pendulum

from core.settings import get_settings
from pipelines.synthetic.landing import GenerateRequest, generate_landing, read_manifest


def _digests(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_dag_run_lands_its_interval_date_exactly_as_the_cli_does(airflow_db, tmp_path):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    dag = DagBag(dag_folder="dags").dags["synthetic_landing"]
    run = dag.test(
        logical_date=pendulum.datetime(2026, 1, 3, tz="UTC"),
        run_conf={"rows_per_day": 500, "seed": 5, "faults": "duplicates=0.02", "feed_start": "2026-01-01"},
    )
    assert run.state == DagRunState.SUCCESS
    # A daily interval timetable: the run at 2026-01-03 covers [01-02, 01-03), so it lands 01-02.
    assert run.data_interval_start == pendulum.datetime(2026, 1, 2, tz="UTC")
    landed = get_settings().landing / "2026-01-02"
    assert read_manifest(landed)["faults"]["duplicates"] > 0
    assert not (get_settings().landing / "2026-01-03").exists()

    from pipelines.synthetic.faults import parse_faults

    generate_landing(
        GenerateRequest(
            start=pendulum.date(2026, 1, 1),
            days=3,
            rows_per_day=500,
            seed=5,
            landing=tmp_path,
            faults=parse_faults("duplicates=0.02"),
        )
    )
    assert _digests(landed) == _digests(tmp_path / "2026-01-02")


def test_a_dag_run_fails_without_retries_rather_than_overwrite_a_producers_folder(airflow_db):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState, TaskInstanceState

    producer = get_settings().landing / "2026-01-04"
    producer.mkdir(parents=True)
    (producer / "transactions-00000.csv").write_text("transaction_id,amount\nt-1,9.99\n")
    (producer / "_SUCCESS").touch()
    before = _digests(producer)

    dag = DagBag(dag_folder="dags").dags["synthetic_landing"]
    run = dag.test(logical_date=pendulum.datetime(2026, 1, 5, tz="UTC"), run_conf={"rows_per_day": 100})
    assert run.state == DagRunState.FAILED
    (attempt,) = run.get_task_instances()
    assert attempt.state == TaskInstanceState.FAILED and attempt.try_number == 1  # not retried
    assert _digests(producer) == before
