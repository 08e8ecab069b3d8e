"""
### Approve a fraud-model candidate: an independent sign-off before a gate pass serves

With `approval.enabled` (MLOPS_APPROVAL__ENABLED=true) the retrain DAG's gate pass moves nothing: it is
recorded as `awaiting_approval` and `fraud_model_candidate` starts this DAG. A manual run names the version
in the `version` param.

- **candidate**: the gate pass waiting for approval (the promotion history); skipped, with everything after
  it, when there is none (already decided, or never asked).
- **approval**: a Human-in-the-loop task (Airflow's HITLOperator): the Airflow UI's *Required actions* shows
  the gate's figures against the champion and links to the candidate's MLflow run (its holdout metrics and
  PR, ROC, confusion and calibration plots); a person chooses **Approve** or **Reject** and may write a
  comment. Only the approvers group (`approval.approvers`, the task's assigned users) may answer: Airflow
  refuses anyone else; the request is sent to the alert channels (`approval_requested`) when the task
  starts waiting. No answer within `approval.timeout_hours`: the task fails (timed out).
- **record_decision** (runs whatever the approval's outcome): the answer goes to the promotion history with
  who decided and their comment. Approve promotes the version, as a compare-and-swap on the champion the gate
  compared it with (another promotion since: refused); Reject, a timeout or a failed approval promote
  nothing. The person who started the retrain run, or this run, cannot approve it, nor can anyone outside
  the approvers group: the decision is refused and the task fails. Cluster profile: a CPU pod of the
  training image (`python -m training approve`).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import DAG, Param, task

from core.settings import get_settings
from orchestration.alerts import ApprovalRequestNotifier, approval_assigned_users, failure_alerts
from orchestration.assets import FRAUD_MODEL_CANDIDATE
from orchestration.tasks import run_step
from training.ledger import APPROVE, REJECT

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "model-risk",
    "retries": 1,
    "retry_delay": timedelta(minutes=1),
    "execution_timeout": timedelta(minutes=10),
}
ASKED = "ti.xcom_pull(task_ids='candidate')"

with DAG(
    dag_id="approve_fraud_model",
    schedule=[FRAUD_MODEL_CANDIDATE],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=8,  # candidates wait for people side by side; each decision takes the ledger's lock
    default_args=DEFAULT_ARGS,
    tags=["fraud", "approval", "mlflow"],
    doc_md=__doc__,
    params={"version": Param("", type="string", description="the version to decide; empty: the event's")},
):

    @task(doc_md="The gate pass waiting for approval, with the figures the approver sees.")
    def candidate(params: dict, triggering_asset_events=None, dag_run=None) -> dict:
        from airflow.sdk.exceptions import AirflowSkipException

        from orchestration.approval import pending_candidate

        events = (triggering_asset_events or {}).get(FRAUD_MODEL_CANDIDATE, [])
        version = params.get("version") or next(
            (e.extra["model_version"] for e in reversed(events) if (e.extra or {}).get("model_version")), None
        )
        if not version:
            raise AirflowSkipException("no version to decide: the run names none and no event does")
        # the version's model card, as the gate step wrote it (the event of that version names it)
        card = next(
            (
                e.extra.get("model_card")
                for e in reversed(events)
                if str((e.extra or {}).get("model_version")) == str(version)
            ),
            None,
        )
        asked = run_step(pending_candidate, str(version), card)
        if asked is None:
            raise AirflowSkipException(f"v{version} has no gate pass waiting for approval")
        return asked

    approval = HITLOperator(
        task_id="approval",
        subject=f"Promote fraud-detector v{{{{ {ASKED}['model_version'] }}}}?",
        body=f"{{{{ {ASKED}['body'] }}}}",
        options=[APPROVE, REJECT],
        params={
            "comment": Param(
                "", type="string", description="why (kept in the promotion history with your name)"
            )
        },
        response_timeout=timedelta(hours=get_settings().approval.timeout_hours),
        # Only the approvers group may answer (Airflow refuses anyone else, 403); they are alerted first.
        assigned_users=approval_assigned_users(get_settings().approval.approvers),
        notifiers=[ApprovalRequestNotifier()],
        retries=0,  # a human decision is not retried: no answer in time is the answer (nothing promoted)
        doc_md="A person approves or rejects the candidate in the Airflow UI (Required actions).",
    )

    if get_settings().training_runner == "kubernetes":
        from orchestration.training_task import step_pod_operator

        @task(trigger_rule="all_done", doc_md="The answer as the approve step's arguments.")
        def answer(ti=None, dag_run=None) -> dict:
            from orchestration.approval import answer_of

            return answer_of(ti, dag_run)

        ANSWER = "ti.xcom_pull(task_ids='answer')"
        recorded = step_pod_operator(
            get_settings(),
            "approve",
            [
                "--version", f"{{{{ {ANSWER}['version'] }}}}",
                "--choice", f"{{{{ {ANSWER}['choice'] }}}}",
                "--decided-by", f"{{{{ {ANSWER}['decided_by'] }}}}",
                "--comment", f"{{{{ {ANSWER}['comment'] }}}}",
                "--started-by", f"{{{{ {ANSWER}['started_by'] }}}}",
                "--dag-id", "{{ dag.dag_id }}", "--dag-run-id", "{{ run_id }}",
            ],
            task_id="record_decision",
        )  # fmt: skip
        candidate() >> approval >> answer() >> recorded
    else:

        @task(trigger_rule="all_done", doc_md="The answer into the promotion history; Approve promotes.")
        def record_decision(ti=None, dag_run=None) -> dict:
            from orchestration.approval import answer_of
            from training import steps

            answered = answer_of(ti, dag_run)
            return run_step(
                steps.approve,
                answered["version"],
                answered["choice"] or None,
                answered["decided_by"] or None,
                answered["comment"],
                (answered["started_by"] or None,),
                dag_run.dag_id,
                dag_run.run_id,
            )

        candidate() >> approval >> record_decision()
