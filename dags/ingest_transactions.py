"""
### Ingest card transactions: landing -> bronze (+ quarantine) -> GX -> silver -> GX

One run per arrival date (the run's data interval start). It waits for the producer's completion marker
`<landing>/<date>/_SUCCESS`, then every row of the date lands in exactly one place: typed in bronze, or in
quarantine with a reason code (malformed, extra_column, missing_required, wrong_type, out_of_range,
invalid_value). Silver is bronze deduplicated by transaction_id (first copy by file and line wins; the
later copies are quarantined as `duplicate`). Each step rewrites only its date's partitions, so any task can
be cleared and rerun. A reconciliation record per date sits in `$MLOPS_HOME/lake/reconciliation/`.

**Why a deferrable sensor, not an AssetWatcher.** Each run owns one arrival date, so reruns, backfills and
the data interval all mean the same thing. An AssetWatcher event is not tied to a date, and the file
triggers that can drive one delete the file they watch, which would make a rerun wait for a resend. The
sensor defers to the triggerer, so waiting holds no worker slot.

Data problems (unusable files, a quarantine rate above `MLOPS_INGEST__MAX_QUARANTINE_RATE`, failed GX
expectations) fail the task at once with a message naming the file, column or expectation; they are not
retried. Chargebacks (`labels-*`) of the date go to silver labels beside it, in a task of their own;
`validate_silver` waits for it, so the `silver_transactions` event that schedules the features DAG (and,
after it, the retrain) is only emitted once the date's labels are in.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, task

from orchestration.alerts import failure_alerts
from orchestration.assets import SILVER_LABELS, SILVER_TRANSACTIONS
from orchestration.tasks import ArrivalSensor, run_step

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(hours=1),
}

with DAG(
    dag_id="ingest_transactions",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one writer per table: dates are ingested one at a time
    default_args=DEFAULT_ARGS,
    tags=["fraud", "ingest", "spark", "great-expectations"],
    doc_md=__doc__,
):
    arrival = ArrivalSensor(
        task_id="wait_for_arrival",
        arrival_date="{{ data_interval_start | ds }}",
        execution_timeout=timedelta(days=1, minutes=5),
        doc_md="Deferred until the producer writes `_SUCCESS` in the date's landing folder.",
    )

    @task(doc_md="Landing files -> bronze (typed) and quarantine (reason codes); writes the reconciliation.")
    def ingest_to_bronze(data_interval_start=None, run_id=None) -> dict:
        from pipelines.ingest import job

        return run_step(job.ingest_to_bronze, data_interval_start.date(), f"airflow:{run_id}")

    @task(doc_md="GX suite bronze_transactions on the date's bronze partition.")
    def validate_bronze(data_interval_start=None) -> dict:
        from pipelines.ingest import job

        return run_step(job.validate_bronze, data_interval_start.date())

    @task(doc_md="Bronze -> silver: deduplicate by transaction_id, sort, replace the date's partition.")
    def build_silver(data_interval_start=None, run_id=None) -> dict:
        from pipelines.ingest import job

        return run_step(job.build_silver, data_interval_start.date(), f"airflow:{run_id}")

    @task(outlets=[SILVER_TRANSACTIONS], doc_md="GX suite silver_transactions; emits the silver asset.")
    def validate_silver(data_interval_start=None, outlet_events=None) -> dict:
        from pipelines.ingest import job

        day = data_interval_start.date()
        result = run_step(job.validate_silver, day)
        # The event names its date, so the features DAG computes exactly the dates that changed.
        outlet_events[SILVER_TRANSACTIONS].extra = {"arrival_date": day.isoformat()}
        return result

    @task(outlets=[SILVER_LABELS], doc_md="Chargebacks of the date -> silver labels (+ quarantine).")
    def ingest_labels(data_interval_start=None, run_id=None) -> dict:
        from pipelines.ingest import job

        return run_step(job.ingest_labels, data_interval_start.date(), f"airflow:{run_id}")

    silver = validate_silver()
    arrival >> ingest_to_bronze() >> validate_bronze() >> build_silver() >> silver
    # The silver event starts the features DAG, whose gold counts the chargebacks reported by each date:
    # it waits for the date's labels, so a features run (and the retrain after it) never starts without them.
    arrival >> ingest_labels() >> silver
