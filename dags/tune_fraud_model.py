"""
### Tune the fraud model: an Optuna study whose trials are parallel mapped tasks

Started by hand (the UI's trigger, or `mlops tune`), with the `as_of` param (empty: the day before the run).
The next retrain (`retrain_fraud_model`) trains with the best trial's parameters and still goes through the
gate: a tuned model becomes champion only by beating the champion on the holdout.

- **training_set**: the same training set a retrain as of that date builds (point in time, DVC-versioned);
  skipped when there is nothing to train on yet.
- **start_study**: the study `<tuning.study_prefix>-<as-of>` in the profile's database (SQLite beside
  MLflow locally, PostgreSQL in the cluster) and its MLflow parent run `tune-<study>`. A run of the same
  date resumes the study: finished trials are kept.
- **trial** (one mapped task per slot, `tuning.trials` of them, `tuning.parallelism` at a time): asks the
  study for learning rate, batch size, weight decay, hidden layers and dropout, trains on the train split
  (`python -m training trial`: a child process locally, a GPU pod in the cluster) and reports validation
  AUC-PR after each epoch; the median pruner stops a poor trial early (state PRUNED). Each trial is an
  MLflow run nested under the parent. A retried slot returns its finished trial, or replaces the trial its
  dead process left running.
- **finish_study** (runs whatever the trials' outcome, unless the run was skipped): records the best
  trial's parameters on the parent run (`best.*`, `best_validation_auc_pr`, counts per state) and marks the
  study finished, which is what the next retrain reads. Fails, with the counts, when no trial completed.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from core.settings import get_settings
from orchestration.alerts import failure_alerts
from orchestration.tasks import (
    MAP_INDEX_LABEL,
    fail_fast_on_bad_data,
    label_mapped_task,
    run_step,
    training_set_or_skip,
)
from orchestration.training_task import (
    local_task_timeout,
    run_training_process,
    step_pod_operator,
    trial_pod_operator,
)

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "ml-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "execution_timeout": timedelta(hours=1),
}
AS_OF = "{{ ti.xcom_pull(task_ids='as_of_date') }}"
TRAINING_SET_REV = "{{ ti.xcom_pull(task_ids='training_set')['training_set_rev'] }}"
STUDY = "{{ ti.xcom_pull(task_ids='start_study')['study'] }}"
SLOTS = list(range(get_settings().tuning.trials))

with DAG(
    dag_id="tune_fraud_model",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "training", "tuning", "optuna", "mlflow"],
    doc_md=__doc__,
    params={"as_of": Param("", type="string", description="YYYY-MM-DD; empty: the day before the run")},
):

    @task(doc_md="The as-of date: the param, else the day before the run's logical date.")
    def as_of_date(params: dict, logical_date=None) -> str:
        if params.get("as_of"):
            return params["as_of"]
        return (logical_date - timedelta(days=1)).date().isoformat()

    @task(doc_md="The retrain's training set as of that date; skipped when there is nothing to train on yet.")
    def training_set(as_of: str, ti=None) -> dict:
        from training.dataset import build_training_set

        return training_set_or_skip(build_training_set, as_of, ti)

    as_of = as_of_date()
    built = training_set(as_of)
    settings = get_settings()
    if settings.training_runner == "kubernetes":
        started = step_pod_operator(
            settings,
            "tune-start",
            ["--as-of", AS_OF, "--training-set-rev", TRAINING_SET_REV],
            task_id="start_study",
        )
        trials = trial_pod_operator(settings, STUDY, SLOTS)
        finished = step_pod_operator(
            settings, "tune-finish", ["--study", STUDY], task_id="finish_study", trigger_rule="none_skipped"
        )
        built >> started >> trials >> finished
    else:

        @task(doc_md="Create or resume the study and its MLflow parent run.")
        def start_study(as_of: str, built: dict) -> dict:
            from training import tuning

            return run_step(tuning.start, as_of, built["training_set_rev"])

        @task(
            max_active_tis_per_dagrun=settings.tuning.parallelism,
            execution_timeout=local_task_timeout(settings),
            map_index_template=MAP_INDEX_LABEL,
            doc_md="One trial of the study: `python -m training trial` as a child process.",
        )
        def trial(slot: int, started: dict) -> dict:
            label_mapped_task(f"slot {slot}")
            arguments = ["trial", "--study", started["study"], "--slot", str(slot)]
            timeout_s = get_settings().training.local_timeout_minutes * 60
            return fail_fast_on_bad_data(lambda: run_training_process(arguments, timeout_s=timeout_s))

        # Whatever the trials' outcome (a failed slot must not hide the others' results), unless skipped.
        @task(
            trigger_rule="none_skipped", doc_md="Record the best trial; the next retrain uses its parameters."
        )
        def finish_study(started: dict) -> dict:
            from training import tuning

            return run_step(tuning.finish, started["study"])

        started_locally = start_study(as_of, built)
        trials_locally = trial.partial(started=started_locally).expand(slot=SLOTS)
        trials_locally >> finish_study(started_locally)
