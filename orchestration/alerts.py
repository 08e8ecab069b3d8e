"""The Airflow side of alerts: notifiers (Airflow's BaseNotifier interface) that send through core/alerts.py a
task's failure, set as every DAG's `on_failure_callback` (a task's last try; retries are not failures yet),
and an approval request, set on the approval task."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk.bases.notifier import BaseNotifier

if TYPE_CHECKING:
    from airflow.sdk.execution_time.hitl import HITLUser


class FailureNotifier(BaseNotifier):
    """A failed task as an alert (`task_failed`): the DAG, task, run, try and the error."""

    template_fields = ()

    def notify(self, context: Any) -> None:
        from core.alerts import Alert, send
        from core.settings import get_settings

        ti = context.get("ti") or context.get("task_instance")
        dag_id = getattr(ti, "dag_id", None) or context["dag"].dag_id
        task_id = getattr(ti, "task_id", "?")
        run_id = getattr(ti, "run_id", None) or context.get("run_id")
        error = context.get("exception")
        if error is not None and error.__cause__ is not None:  # fail_fast_on_bad_data's wrapper: its cause
            error = error.__cause__
        details = {
            "dag_id": dag_id,
            "task_id": task_id,
            "run_id": run_id,
            "try_number": getattr(ti, "try_number", None),
            "error": None if error is None else f"{type(error).__name__}: {error}",
        }
        send(
            get_settings(),
            Alert(
                "task_failed",
                f"{dag_id}.{task_id} failed ({run_id})",
                f"Task {task_id} of DAG {dag_id}, run {run_id}, failed on its last try: "
                f"{details['error'] or 'no error recorded'}. Its log is in the Airflow UI.",
                details,
            ),
        )


class ApprovalRequestNotifier(BaseNotifier):
    """An approval request as an alert (`approval_requested`), sent when the approval task starts waiting:
    the candidate, the gate's figures and links (the body the approver reads in the Airflow UI), who may
    answer and by when."""

    template_fields = ()

    def notify(self, context: Any) -> None:
        from core.alerts import Alert, send
        from core.settings import get_settings

        settings = get_settings()
        ti = context.get("ti") or context.get("task_instance")
        asked = ti.xcom_pull(task_ids="candidate") or {}
        version = asked.get("model_version")
        approvers, who = who_may_answer(settings)
        send(
            settings,
            Alert(
                "approval_requested",
                f"approval requested: fraud-detector v{version}",
                f"fraud-detector v{version} waits for a sign-off (the Airflow UI's Required actions) "
                f"within {settings.approval.timeout_hours:g} hours; who may answer: {who}.\n\n"
                + str(asked.get("body", "")),
                {
                    "model_version": version,
                    "champion_version": asked.get("champion_version"),
                    "history_id": asked.get("history_id"),
                    "approvers": approvers,
                    "dag_id": getattr(ti, "dag_id", None),
                    "run_id": getattr(ti, "run_id", None),
                },
            ),
        )


def who_may_answer(settings: Any) -> tuple[list[str], str]:
    """The approvers group, and who may answer a request in words."""
    approvers = list(settings.approval.approvers)
    return approvers, ", ".join(approvers) or "any user allowed to act on the DAG (no approvers set)"


class ErasureRequestNotifier(BaseNotifier):
    """An erasure request as an alert (`erasure_requested`), sent when its approval task starts waiting: the
    request's reference, who asked and who may answer; the id itself stays in Airflow (the UI shows it to
    the approvers), not in a mail or a webhook's log."""

    template_fields = ()

    def notify(self, context: Any) -> None:
        from core.alerts import Alert, send
        from core.settings import get_settings

        settings = get_settings()
        ti = context.get("ti") or context.get("task_instance")
        asked = ti.xcom_pull(task_ids="request") or {}
        approvers, who = who_may_answer(settings)
        send(
            settings,
            Alert(
                "erasure_requested",
                f"erasure requested: {asked.get('request') or 'no reference'}",
                f"An erasure of a customer's data waits for a decision (the Airflow UI's Required actions, "
                f"run {getattr(ti, 'run_id', None)} of {getattr(ti, 'dag_id', None)}) within "
                f"{settings.approval.timeout_hours:g} hours; asked by "
                f"{asked.get('started_by') or 'an unnamed user'}; who may answer: {who}.",
                {
                    "request": asked.get("request"),
                    "approvers": approvers,
                    "dag_id": getattr(ti, "dag_id", None),
                    "run_id": getattr(ti, "run_id", None),
                },
            ),
        )


def approval_assigned_users(approvers: list[str]) -> list[HITLUser] | None:
    """The approval task's assigned users (Airflow's HITL respondents) from the approvers group; None: any
    user allowed to act on the DAG."""
    from airflow.sdk.execution_time.hitl import HITLUser

    return [HITLUser(id=user, name=user) for user in approvers] or None


def failure_alerts() -> list[FailureNotifier]:
    """What a DAG's default_args take as `on_failure_callback`."""
    return [FailureNotifier()]
