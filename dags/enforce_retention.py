"""
### Retention of the raw layers

Once a day, deletes the landing folders and the quarantined rows (transactions and chargebacks) older than
their retention (`MLOPS_RETENTION__LANDING_DAYS`, `MLOPS_RETENTION__QUARANTINE_DAYS`), counted back from the
newest arrival the lake has ingested: the lake's own dates, not the calendar, so a replayed or late feed is
not emptied by the clock. A landing folder the lake has not ingested is kept whatever its age. The scoring
log's dates past `MLOPS_SERVING__LOG_RETENTION_DAYS` before its newest go too (the service expires them as it
writes; this covers a service that is idle or down). The same work by hand:
`mlops retention`; a person's rows on request: `mlops erase --customer ID` (pipelines/privacy.py).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, task

from orchestration.alerts import failure_alerts

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=5),
    "execution_timeout": timedelta(minutes=30),
}

with DAG(
    dag_id="enforce_retention",
    schedule=CronDataIntervalTimetable("30 3 * * *", timezone="UTC"),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "privacy", "retention"],
    doc_md=__doc__,
):

    @task(doc_md="Delete landing folders and quarantined rows past their retention; report what went.")
    def enforce() -> dict:
        from core.settings import get_settings
        from pipelines.privacy import enforce_retention

        return enforce_retention(get_settings())

    enforce()
