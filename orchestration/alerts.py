"""The Airflow side of alerts: a notifier (Airflow's BaseNotifier interface) that sends a task's failure
through core/alerts.py, set as every DAG's `on_failure_callback` (a task's last try; retries are not
failures yet)."""

from __future__ import annotations

from typing import Any

from airflow.sdk.bases.notifier import BaseNotifier


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


def failure_alerts() -> list[FailureNotifier]:
    """What a DAG's default_args take as `on_failure_callback`."""
    return [FailureNotifier()]
