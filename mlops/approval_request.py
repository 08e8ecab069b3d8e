"""Asking a person from a command: a gate pass waiting for approval starts the approval DAG the way the
retrain DAG's `ask_approval` task does it, with a `fraud_model_candidate` asset event, posted to this
installation's running Airflow (`make up`). `mlops retrain` and `mlops promote --gate` do it when their gate
pass waits; `mlops ask-approval --version N` does it for a pass already recorded (after starting Airflow)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

APPROVE_DAG = "approve_fraud_model"
WAIT_FOR_RUN_S = 180.0  # the scheduler turns the event into a run within a heartbeat or two


class NoAirflowError(RuntimeError):
    """No Airflow of this installation is running to ask; the message says what to do."""


def candidate_extra(record: dict[str, Any], started_by: str | None) -> dict[str, Any]:
    """The event's payload, as the retrain DAG's ask_approval task writes it."""
    return {
        "model_version": record["model_version"],
        "champion_version": record.get("previous_champion"),
        "reason": record.get("reason"),
        "history_id": record.get("history_id"),
        "model_card": record.get("model_card"),
        "triggered_by": started_by,
        "dag_id": None,
        "run_id": None,
    }


def airflow_running(settings: Settings) -> bool:
    """Whether this installation's stack (scripts/up.sh) has its Airflow components up."""
    from mlops import stack

    pids = [settings.home / "run" / f"{name}.pid" for name in stack.AIRFLOW_COMPONENTS]
    return all(p.exists() for p in pids) and not stack.stopped_components(settings)


def ask(
    settings: Settings,
    record: dict[str, Any],
    started_by: str | None,
    echo: Callable[[str], None],
    api: Any = None,
) -> str:
    """Post the candidate event for the waiting gate pass `record` and return the approval run it started.
    Raises NoAirflowError (nothing posted) when no Airflow of this installation runs."""
    from mlops import stack as embedded
    from mlops.airflow_api import AirflowAPI
    from orchestration.assets import FRAUD_MODEL_CANDIDATE

    version = record["model_version"]
    if api is None:
        if not airflow_running(settings):
            raise NoAirflowError(
                f"v{version} waits for a person's approval, but no Airflow of this installation runs to ask "
                f"them: start it (`make up`), then `mlops ask-approval --version {version}`"
            )
        stack = embedded.up(settings, {}, echo)
        api = AirflowAPI(stack.airflow_url, stack.username, stack.password)
    api.unpause(APPROVE_DAG)  # a paused DAG would leave the event unanswered
    asset_id, event_id = api.post_asset_event(FRAUD_MODEL_CANDIDATE.uri, candidate_extra(record, started_by))
    runs = api.wait_for_event_runs(asset_id, event_id, time.monotonic() + WAIT_FOR_RUN_S)
    run_id = runs[0].run_id
    echo(
        f"v{version} waits for approval: {APPROVE_DAG} run {run_id} asks the approvers group in the Airflow "
        "UI's Required actions"
    )
    return run_id
