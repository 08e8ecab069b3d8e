"""
### Retention of every layer

Once a day, counted back from the newest arrival the lake has ingested (the lake's own dates, not the
calendar, so a replayed or late feed is not emptied by the clock):

- landing folders and quarantined rows past `MLOPS_RETENTION__LANDING_DAYS` and `__QUARANTINE_DAYS` (a landing
  folder the lake has not ingested is kept whatever its age), the scoring log's dates past
  `MLOPS_SERVING__LOG_RETENTION_DAYS` (the service expires them as it writes; this covers one idle or down);
- the lake's dated partitions (bronze, silver, gold, their states, the training rows) and the training sets
  past `MLOPS_RETENTION__LAKE_DAYS`;
- the DVC revisions past `MLOPS_RETENTION__DATASET_DAYS` and the objects only they used, but the training sets
  of versions that may serve again (an alias names them, or a rollback could restore them);
- the MLflow artifacts of the other versions trained on data past `MLOPS_RETENTION__MODEL_DAYS`.

A retention shorter than what one retrain reads deletes nothing and fails, naming the setting. The same work
by hand: `mlops retention`; a person's rows on request: `mlops erase --customer ID`.

- Cluster (`training.runner=kubernetes`): the Airflow image has no MLflow, so the models' part runs in a CPU
  pod of the training image with the promoter's identity (it reads the promotion history): **plan** checks
  the retentions' floor and finds the newest arrival ingested, **models** (`python -m training
  retention-models`) names the training sets of the versions that may serve again and deletes the expired
  versions' artifacts, **enforce** deletes the rest, keeping those training sets.
- Local: **enforce** does all of it in the worker.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, CronDataIntervalTimetable, task

from core.settings import get_settings
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
    if get_settings().training_runner == "kubernetes":
        from orchestration.training_task import step_pod_operator

        @task(doc_md="Check the retentions' floor before anything is deleted; the newest arrival ingested.")
        def plan() -> dict:
            from mlops.chain import retention_plan

            return retention_plan(get_settings())

        NEWEST = "{{ ti.xcom_pull(task_ids='plan')['newest_ingested'] }}"
        models = step_pod_operator(get_settings(), "retention-models", ["--newest", NEWEST], "models")

        @task(doc_md="Delete what the lake and the datasets keep past their retention, but what may serve.")
        def enforce(models: dict) -> dict:
            from mlops.chain import retention

            return retention(get_settings(), models=models)

        plan() >> models
        enforce(models.output)
    else:

        @task(doc_md="Delete what every layer keeps past its retention; report what went and what stayed.")
        def enforce() -> dict:
            from mlops.chain import retention

            return retention(get_settings())

        enforce()
