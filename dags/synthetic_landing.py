"""
### Synthetic landing

Stands in for an upstream system: every day it lands one arrival date of synthetic card transactions and
chargebacks in the landing zone (`$MLOPS_HOME/landing/<date>/`), written by the same generator as
`mlops generate`. The arrival date is the run's data interval start, so a backfill or rerun of a date
rewrites exactly that date, byte for byte. Each folder appears whole (written aside, then renamed) with a
`_GENERATED_BY` marker; a date folder without it is a producer's delivery, and the task fails (no retries)
rather than overwrite it.

Params: `rows_per_day`, `seed`, `faults` (`KIND=RATE,...`, see `pipelines/synthetic/faults.py`) and
`feed_start`, the first date of the feed: chargebacks landing on a date refer to transactions made since
then, exactly as if `mlops generate --start <feed_start>` had written the whole range at once.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, Param, task

from orchestration.alerts import failure_alerts

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "execution_timeout": timedelta(minutes=30),
}

with DAG(
    dag_id="synthetic_landing",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    # Made-up arrivals for a demo or a test: never started by a deploy that makes the product's DAGs active
    # (infra/helm/airflow/values.yaml, dags_are_paused_at_creation); unpause it by hand where it is wanted.
    is_paused_upon_creation=True,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "synthetic", "landing"],
    doc_md=__doc__,
    params={
        "rows_per_day": Param(2000, type="integer", minimum=0),
        "seed": Param(7, type="integer"),
        "faults": Param("", type="string", description="KIND=RATE,... e.g. duplicates=0.01"),
        "feed_start": Param("2026-01-01", type="string", format="date"),
    },
):

    @task(doc_md="Generate the arrival date of this run's data interval into the landing zone.")
    def land_arrival(params: dict, data_interval_start: pendulum.DateTime | None = None) -> dict:
        from datetime import date

        from core.settings import get_settings
        from orchestration.tasks import fail_fast_on_bad_data
        from pipelines.synthetic.landing import land_synthetic

        if data_interval_start is None:
            raise ValueError("synthetic_landing needs a data interval: trigger it with a logical date")
        start = data_interval_start.date()
        (manifest,) = fail_fast_on_bad_data(
            lambda: land_synthetic(
                get_settings(),
                start=start,
                days=1,
                rows_per_day=params["rows_per_day"],
                seed=params["seed"],
                faults=params["faults"] or None,
                feed_start=date.fromisoformat(params["feed_start"]),
            )
        )
        return {
            "arrival_date": manifest["arrival_date"],
            "rows_written": manifest["transactions"]["rows_written"],
        }

    land_arrival()
