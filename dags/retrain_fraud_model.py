"""
### Retrain the fraud model: training set -> train -> evaluate -> register -> gate -> ONNX export -> compress

Runs weekly (Monday 04:00 UTC) **or** when the `fraud_features` asset is updated (new features) **or** when
`fraud_drift` is (the monitor DAG found the traffic drifted from the champion's training reference),
whichever comes first. The as-of date is the `as_of` param of a manual run, else the latest date the
triggering events name (feature event dates, drifted days), else the day before a scheduled run.

- **as_of_date** also records why the run started, as a sentence and the triggering events (its XCom
  `start_reason` and its log): e.g. `drift: log_amount_usd PSI 0.43 KS 0.31; channel PSI 0.52 (check of
  2026-01-10, ...)`, `fraud_features of 2026-01-10`, `the time schedule`.

- **training_set**: labeled transactions (labels as known at the end of the as-of date) joined point in
  time with the `fraud_model_v1` features, split by event time, versioned with DVC (the revision travels on).
  When there is nothing to train on yet (no silver transactions in the window, or none older than the label
  maturity: the first days of a feed) the task and everything after it are skipped, not failed; the reason
  is in the task's log and its `skipped` XCom.
- **skip_identical**: when a registered version was trained from the same training-set revision, code
  commit, configuration (every argument that changes the result) and image, training would give it again:
  the task and everything after it are skipped, with the reason in the log, the `skipped` XCom and an MLflow
  run (`retrain.skipped`). A drift event for an as-of already trained therefore registers nothing new. The
  `force` param of a manual run trains anyway.
  Cluster profile: a CPU pod of `python -m training identical` (exit 99: skipped). Uncommitted changes to
  the code count (a digest of the diff is part of its identity).
- **train**: `python -m training train --training-set-rev ...`. Cluster profile: a KubernetesPodOperator on a
  GPU node (`torchrun` with one process per GPU when it has several; restricted pod, the shared volume
  read-only, credentials from a Secret, checkpoints on a volume claim so a retry resumes,
  deferrable, reattaches after a scheduler restart, pod deleted at the end); the MLflow run id comes back
  through XCom. Local profile (or `MLOPS_TRAINING__RUNNER=local`): the same command as a child process,
  stopped with its whole process group when the task is stopped or after `training.local_timeout_minutes`.
- **evaluate, register, promote, export**: in the cluster profile each is a CPU pod of the training image
  (`python -m training <step>`, result through XCom), since the Airflow image carries neither torch nor
  MLflow; a last task, **publish_model**, emits the `fraud_model` asset from their results. Locally they are
  Python tasks calling the same steps.
- **evaluate**: holdout metrics and PR/ROC/confusion/calibration pictures into the MLflow run.
- **register**: a new version of `fraud-detector`.
- **promote**: the gate scores challenger and champion on the same holdout and moves the `champion` alias
  only if the challenger wins by the margin within the guardrails; every decision goes to the promotion
  history (`mlops history`; `mlops rollback` undoes the last promotion).
- **export**: fp32 ONNX with a parity check, for every candidate (a shadow or a later approval serves it).
  Emits the `fraud_model` asset.
- **compress**: for a promoted version only (skipped otherwise, with the reason): the int8, pruned and
  student variants, measured against fp32 on the holdout; the smallest as accurate is served (the scoring
  service follows the version's `onnx.serving_file` tag). After the decision, so no candidate waits for it;
  an approval or `mlops promote` makes them for the version it promotes. Cluster profile: a CPU pod of
  `python -m training compress` (exit 99: skipped).
- **ask_approval**: with `approval.enabled` (MLOPS_APPROVAL__ENABLED=true), or the `require_approval` param of
  a manual run, a gate pass moves nothing: it is recorded as `awaiting_approval` and this task emits
  `fraud_model_candidate`, which starts `approve_fraud_model`, where a person approves or rejects it.
  Skipped otherwise. The param can ask for a sign-off the settings do not; it cannot waive one they do.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, AssetOrTimeSchedule, CronTriggerTimetable, Param, task

from core.errors import EXIT_SKIPPED
from core.settings import get_settings
from orchestration.alerts import failure_alerts
from orchestration.assets import FRAUD_DRIFT, FRAUD_FEATURES, FRAUD_MODEL, FRAUD_MODEL_CANDIDATE
from orchestration.tasks import (
    event_dates,
    fail_fast_on_bad_data,
    run_step,
    start_reason,
    training_set_or_skip,
)
from orchestration.training_task import (
    TRAIN_TASK_ID,
    local_task_timeout,
    run_training_process,
    step_pod_operator,
    train_arguments,
    training_pod_operator,
)

SKIP_IDENTICAL = "skip_identical"
DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "ml-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(hours=1),
}
TRAINING_SET_REV = "{{ ti.xcom_pull(task_ids='training_set')['training_set_rev'] }}"
RUN_ID = "{{ ti.xcom_pull(task_ids='train')['run_id'] }}"
# The image the train pod ran, by digest, as its node reported it (orchestration/training_task.py).
IMAGE_ID = "{{ ti.xcom_pull(task_ids='train').get('image_id', '') }}"
MODEL_VERSION = "{{ ti.xcom_pull(task_ids='register')['model_version'] }}"
DECISION = "{{ ti.xcom_pull(task_ids='promote')['decision'] }}"

with DAG(
    dag_id="retrain_fraud_model",
    # `|`: either asset starts a run (a list would mean both, AssetAll).
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 4 * * 1", timezone="UTC"), assets=FRAUD_FEATURES | FRAUD_DRIFT
    ),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "training", "mlflow", "kubernetes"],
    doc_md=__doc__,
    params={
        "as_of": Param("", type="string", description="YYYY-MM-DD; empty: from the trigger"),
        "force": Param(
            False, type="boolean", description="train even when identical to a registered version"
        ),
        "require_approval": Param(
            False,
            type="boolean",
            description="a gate pass waits for a person's approval (approve_fraud_model) even when the "
            "approval.enabled setting is off; it cannot waive an approval the setting requires",
        ),
    },
):

    @task(
        doc_md="The as-of date: param, else the newest date the triggering feature and drift events name, "
        "else yesterday. Records why the run started (XCom `start_reason`, and the log)."
    )
    def as_of_date(
        params: dict, logical_date=None, triggering_asset_events=None, dag_run=None, ti=None
    ) -> str:
        import logging

        reason = start_reason(triggering_asset_events, dag_run.run_type, params)
        logging.getLogger(__name__).info("run started by %s", reason["reason"])
        ti.xcom_push(key="start_reason", value=reason)  # for the UI, `mlops demo` and the tests
        if params.get("as_of"):
            return params["as_of"]
        events = triggering_asset_events or {}
        dates = event_dates([*events.get(FRAUD_FEATURES, []), *events.get(FRAUD_DRIFT, [])])
        if dates:
            return max(dates)
        return (logical_date - timedelta(days=1)).date().isoformat()

    @task(
        doc_md="Point-in-time training set from Feast, split by event time, versioned with DVC. Skipped "
        "(with the whole run) when there is nothing to train on yet."
    )
    def training_set(as_of: str, ti=None) -> dict:
        from training.dataset import build_training_set

        return training_set_or_skip(build_training_set, as_of, ti)

    @task(
        outlets=[FRAUD_MODEL_CANDIDATE],
        doc_md="With `approval.enabled`: a gate pass waits for a person; emit `fraud_model_candidate`, which "
        "starts the approval DAG. Skipped otherwise.",
    )
    def ask_approval(decision: dict, outlet_events=None, dag_run=None) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        if decision["decision"] != "awaiting_approval":
            raise AirflowSkipException(f"the gate's decision is {decision['decision']}: no approval to ask")
        asked = {
            "model_version": decision["model_version"],
            "champion_version": decision["previous_champion"],
            "reason": decision["reason"],
            "history_id": decision["history_id"],
            "model_card": decision.get("model_card"),  # training/model_card.py: the approver reads it
            "triggered_by": getattr(dag_run, "triggering_user_name", None),
            "dag_id": dag_run.dag_id,
            "run_id": dag_run.run_id,
        }
        outlet_events[FRAUD_MODEL_CANDIDATE].extra = asked
        return asked

    if get_settings().training_runner == "kubernetes":
        # Training and the steps after it run in the training image (torch, MLflow), each its own pod; the
        # Airflow image carries neither. Each pod records its result in the pod results table
        # (core/pod_results.py), which its task reads back: no XCom sidecar, no exec.
        settings = get_settings()
        same = step_pod_operator(
            settings,
            "identical",
            [
                "--training-set-rev",
                TRAINING_SET_REV,
                "--dag-id",
                "{{ dag.dag_id }}",
                "--dag-run-id",
                "{{ run_id }}",
                "{{ '--force' if params.force else '--no-force' }}",
            ],
            task_id=SKIP_IDENTICAL,
            skip_on_exit_code=EXIT_SKIPPED,
        )
        trained = training_pod_operator(settings, TRAINING_SET_REV, retries=2)
        evaluated = step_pod_operator(settings, "evaluate", ["--run-id", RUN_ID])
        registered = step_pod_operator(settings, "register", ["--run-id", RUN_ID, "--image-id", IMAGE_ID])
        decision = step_pod_operator(
            settings,
            "promote",
            [
                "--version", MODEL_VERSION, "--dag-id", "{{ dag.dag_id }}", "--dag-run-id", "{{ run_id }}",
                "--triggered-by", "{{ dag_run.triggering_user_name or '' }}",
                "{{ '--require-approval' if params.require_approval else '--no-require-approval' }}",
            ],
        )  # fmt: skip
        exported = step_pod_operator(settings, "export", ["--version", MODEL_VERSION])
        compressed = step_pod_operator(
            settings,
            "compress",
            ["--version", MODEL_VERSION, "--decision", DECISION],
            skip_on_exit_code=EXIT_SKIPPED,
        )

        @task(outlets=[FRAUD_MODEL], doc_md="Announce the exported model (the `fraud_model` asset).")
        def publish_model(registered: dict, decision: dict, exported: dict, outlet_events=None) -> dict:
            outlet_events[FRAUD_MODEL].extra = {
                "model_version": registered["model_version"],
                "decision": decision["decision"],
                "champion_version": decision["champion_version"],
            }
            return exported

        training_set(as_of_date()) >> same >> trained
        trained >> evaluated >> registered >> decision >> exported >> compressed
        publish_model(registered.output, decision.output, exported.output)
        ask_approval(decision.output)
    else:

        @task(
            task_id=TRAIN_TASK_ID,
            execution_timeout=local_task_timeout(get_settings()),
            doc_md="`python -m training train`, stopped (its whole process group) with the task",
        )
        def train_locally(ti=None, dag_run=None) -> dict:
            built = ti.xcom_pull(task_ids="training_set")
            arguments = train_arguments(
                built["training_set_rev"],
                dag_id=dag_run.dag_id,
                dag_run_id=dag_run.run_id,
                training_set_seconds=str(built["seconds"]),
            )
            timeout_s = get_settings().training.local_timeout_minutes * 60
            # A diverged run or bad training data (the child's exit 3) fails the task without retries.
            return fail_fast_on_bad_data(lambda: run_training_process(arguments, timeout_s=timeout_s))

        @task(doc_md="Holdout metrics and curves into the MLflow run.")
        def evaluate(trained: dict) -> dict:
            from training import steps

            return run_step(steps.evaluate, trained["run_id"])

        @task(doc_md="Register the run's model as a new version of fraud-detector.")
        def register(trained: dict) -> dict:
            from training import steps

            return run_step(steps.register, trained["run_id"])

        @task(doc_md="Champion/challenger gate on the same holdout; the decision is recorded either way.")
        def promote(registered: dict, params: dict, dag_run=None) -> dict:
            from training import steps

            return run_step(
                steps.promote,
                registered["model_version"],
                dag_run.dag_id,
                dag_run.run_id,
                getattr(dag_run, "triggering_user_name", None),
                bool(params.get("require_approval")),
            )

        @task(outlets=[FRAUD_MODEL], doc_md="ONNX export with parity check; int8 where it pays.")
        def export(registered: dict, decision: dict, outlet_events=None) -> dict:
            from training import steps

            result = run_step(steps.export, registered["model_version"])
            outlet_events[FRAUD_MODEL].extra = {
                "model_version": registered["model_version"],
                "decision": decision["decision"],
                "champion_version": decision["champion_version"],
            }
            return result

        @task(doc_md="The int8, pruned and student variants of a promoted version (others: skipped).")
        def compress(registered: dict, decision: dict) -> dict:
            from airflow.sdk.exceptions import AirflowSkipException

            from training import steps

            made = run_step(steps.compress, registered["model_version"], decision["decision"])
            if made.get("skip"):
                raise AirflowSkipException(made["reason"])
            return made

        @task(
            task_id=SKIP_IDENTICAL,
            doc_md="Skip the training and the steps after it when a registered version came from the same "
            "training set, code commit, configuration and image; the reason in the log, the `skipped` XCom "
            "and an MLflow run.",
        )
        def skip_identical(params: dict, ti=None, dag_run=None) -> dict:
            from airflow.sdk.exceptions import AirflowSkipException

            from training import steps
            from training.tuning import train_config

            settings = get_settings()
            rev = ti.xcom_pull(task_ids="training_set")["training_set_rev"]
            if params.get("force"):
                return {"identical": None, "forced": True, "training_set_rev": rev}
            same = run_step(steps.identical, rev, train_config(settings), dag_run.dag_id, dag_run.run_id)
            if same["identical"]:
                ti.xcom_push(key="skipped", value=same["reason"])
                raise AirflowSkipException(same["reason"])
            return same

        trained_locally = train_locally()
        training_set(as_of_date()) >> skip_identical() >> trained_locally
        evaluated_locally = evaluate(trained_locally)
        registered_locally = register(trained_locally)
        evaluated_locally >> registered_locally
        decided_locally = promote(registered_locally)
        exported_locally = export(registered_locally, decided_locally)
        exported_locally >> compress(registered_locally, decided_locally)
        ask_approval(decided_locally)
