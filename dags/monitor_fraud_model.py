"""
### Monitor the fraud model: drift against the champion's training reference, live performance, rollback

Scheduled on `fraud_features_online | scoring_log`: each arrival's features loaded into the online store
(the features DAG's event names its event dates), or the scoring service's log of a day (an event posted
with `extra={"event_dates": [...]}`). A manual run names its dates in the `date` param (comma-separated).

- **dates_to_check**: the `date` param, else the dates the triggering events name.
- **check** (`monitoring.check.run_checks`), per date:
  - drift of the model's inputs (numeric: PSI on the reference's quantile bins and the KS statistic;
    channel, merchant category, country: PSI) and of the champion's score, against the champion's training
    reference (its train split, scored by its ONNX export; cached per version). The day's traffic is the
    scoring log when it holds `monitoring.min_rows` rows, else the day's arrived transactions with the
    features the training set gives them. Drift: `monitoring.min_drifted` inputs beyond both thresholds.
  - live AUC-PR and recall at 1% FPR of each served and shadow version on the matured window's traffic
    the feed confirms (silver's ids, customers and event times; made-up or re-dated rows are counted and
    left out), declined transactions excluded (their frauds never become chargebacks); no verdict while
    the chargebacks reported fall short of what the history says should be in by now.
  - rollback: the champion's live AUC-PR below the previous champion's on the same rows by more than
    `monitoring.max_live_auc_pr_drop`, significantly (paired bootstrap), rolls back through the gate as a
    compare-and-swap on the champion judged; one a run, none within the cool-down of an alias move. The
    promotion history (`mlops history`) records it with both figures.
  - results: one row per check and input in the monitoring results table (`python -m monitoring results`),
    and an MLflow run in `fraud-monitoring` with metrics per input, psi.png and report.html.

  With the kubernetes runner (`training.runner`, the cluster profile's default): a CPU pod of the training
  image (`python -m monitoring check`), like the retrain DAG's steps after training: the Airflow image carries
  neither MLflow nor onnxruntime nor SciPy.
- **announce_drift**: emits `fraud_drift` (which starts `retrain_fraud_model`) with the drifted days, inputs
  and figures in its `extra` and a one-line `summary`; skipped (no event) when nothing drifted.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from core.settings import get_settings
from orchestration.alerts import failure_alerts
from orchestration.assets import FRAUD_DRIFT, FRAUD_FEATURES_ONLINE, SCORING_LOG
from orchestration.tasks import (
    dates_from_param_or_events,
    fail_fast_on_bad_data,
    monitor_pod_operator,
    run_step,
)

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "ml-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(minutes=30),
}
DATES = "{{ ti.xcom_pull(task_ids='dates_to_check') | join(',') }}"

with DAG(
    dag_id="monitor_fraud_model",
    schedule=FRAUD_FEATURES_ONLINE | SCORING_LOG,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # checks append to one results table and may roll the champion back: one at a time
    default_args=DEFAULT_ARGS,
    tags=["fraud", "monitoring", "mlflow"],
    doc_md=__doc__,
    params={
        "date": Param("", type="string", description="YYYY-MM-DD, several comma-separated; empty: events")
    },
):

    @task(doc_md="The dates to check: the date param, else the dates the triggering events name.")
    def dates_to_check(params: dict, triggering_asset_events=None) -> list[str]:
        # a malformed date fails the task at once (no retries can fix it), and alerts
        return fail_fast_on_bad_data(
            lambda: dates_from_param_or_events(params.get("date", ""), triggering_asset_events)
        )

    if get_settings().training_runner == "kubernetes":  # the one switch of every DAG that launches pods
        checked = monitor_pod_operator(get_settings(), DATES)
        dates_to_check() >> checked
        check_result = checked.output
    else:

        @task(doc_md="Drift, live performance and the rollback rule for each date; results recorded.")
        def check(days: list[str], dag_run=None) -> dict:
            from datetime import date

            from monitoring.check import run_checks

            return run_step(run_checks, [date.fromisoformat(d) for d in days], dag_run.dag_id, dag_run.run_id)

        check_result = check(dates_to_check())

    @task(outlets=[FRAUD_DRIFT], doc_md="Emit fraud_drift (starts a retrain) when a check found drift.")
    def announce_drift(checked: dict, outlet_events=None) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        if not checked["drift"]:
            verdicts = "; ".join(f"{c['day']}: {c['verdict']}" for c in checked["checks"])
            raise AirflowSkipException(f"no drift ({verdicts}): no fraud_drift event")
        outlet_events[FRAUD_DRIFT].extra = checked["drift_event"]
        return checked["drift_event"]

    announce_drift(check_result)
