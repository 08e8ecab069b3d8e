"""
### Batch-score a day with the champion (or a named version)
Manual (or triggered through the REST API): the `date` param names the day, `version` a registered version
to score with (empty: the champion the promotion history records).
- **score** (`serving.batch.score_day`): the live state as the scoring service would have had it at the day's
  start (loaded from the lake), the day's silver transactions and fraud chargebacks fed in event-time order
  through the service's own scorer, every transaction's score, decision and features written to
  `lake/decisions/date=<day>/v<version>.parquet` (a rerun replaces it), with a summary beside it. A
  transaction the state refuses as older than its entities' kept history is counted and named, not scored.
  Use it for a backtest, a back-fill, or a challenger's "what would it have decided".
  With the kubernetes runner (`training.runner`): a CPU pod of the training image (`python -m serving.batch`),
  which may write `lake/decisions` of the shared volume and nothing else of it.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from core.settings import get_settings
from orchestration.alerts import failure_alerts
from orchestration.tasks import BATCH_SCORING_COMMAND, cpu_pod_operator, run_step

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),
    "owner": "ml-platform",
    "retries": 1,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(hours=2),
}

with DAG(
    dag_id="score_fraud_batch",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "serving", "batch"],
    doc_md=__doc__,
    params={
        "date": Param(type="string", format="date", description="the day to score, YYYY-MM-DD"),
        "version": Param("", type="string", description="a registered version; empty: the champion"),
    },
):
    if get_settings().training_runner == "kubernetes":  # the one switch of every DAG that launches pods
        cpu_pod_operator(
            get_settings(),
            "score",
            "fraud-batch-score",
            BATCH_SCORING_COMMAND,
            ["--date", "{{ params.date }}", "--version", "{{ params.version }}"],
            writable=["lake/decisions"],
        )
    else:

        @task(doc_md="Score the day and write its decisions to the lake.")
        def score(params: dict | None = None) -> dict:  # Airflow passes the run's params
            from dataclasses import asdict
            from datetime import date

            from serving.batch import score_day

            given = params or {}
            day = date.fromisoformat(given["date"])
            return asdict(run_step(score_day, day, given.get("version") or None))

        score()
