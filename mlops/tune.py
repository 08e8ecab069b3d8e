"""`mlops tune`: a hyperparameter study through Airflow. Starts the embedded stack if it is not running (as
`mlops demo` does), triggers `tune_fraud_model`, follows the run, and reports each trial (its mapped task's
state and times, the study's verdict) and the best parameters, which the next retrain trains with.

How many trials, how many at once and how many epochs each are the stack's settings (MLOPS_TUNING__TRIALS,
__PARALLELISM, __EPOCHS when `make up` or the demo started it): the DAG maps its trial task at parse time.
"""

from __future__ import annotations

import time
from datetime import date, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from core.settings import Settings

TUNE = "tune_fraud_model"


class TuningRunError(RuntimeError):
    """The tuning DAG run did not end with a recommendation; the message names the tasks and what to read."""


def tune_through_airflow(settings: Settings, as_of: date | None, console: Console, timeout: float) -> dict:
    from mlops import stack as embedded
    from mlops.airflow_api import AirflowAPI, wait_until

    def echo(line: str) -> None:
        console.print(line, markup=False, highlight=False)

    deadline = time.monotonic() + timeout
    stack = embedded.up(settings, {}, echo)
    api = AirflowAPI(stack.airflow_url, stack.username, stack.password)
    api.on_poll = embedded.StackWatchdog(settings, lambda: embedded.up(settings, {}, echo), echo)
    try:
        wait_until(
            lambda: TUNE in api.dag_ids() or None, deadline, f"the DAG {TUNE} to be parsed", api.on_poll
        )
        api.unpause(TUNE)
        run_id = api.trigger(TUNE, {"as_of": as_of.isoformat() if as_of else ""})
        console.print(f"{TUNE}: run {run_id} (Airflow UI: {stack.airflow_url}/dags/{TUNE}/runs/{run_id})")
        run = api.wait_for_run(TUNE, run_id, deadline)
        instances = api.task_instances(TUNE, run_id)
        states = {ti.task_id: _state(ti.state) for ti in instances if ti.task_id != "trial"}
        if states.get("training_set") == "skipped":
            reason = api.xcom(TUNE, run_id, "training_set", key="skipped")
            return {"dag_run_id": run_id, "status": "skipped", "reason": reason}
        trials = []
        for ti in sorted((t for t in instances if t.task_id == "trial"), key=lambda t: t.map_index):
            record: dict[str, Any] = {
                "slot": ti.map_index,
                "task_state": _state(ti.state),
                "started": ti.start_date,
                "ended": ti.end_date,
            }
            if _state(ti.state) == "success":
                record.update(api.xcom(TUNE, run_id, "trial", map_index=ti.map_index))
            trials.append(record)
        if _state(run.state) != "success" or states.get("finish_study") != "success":
            failed = sorted(
                {t.task_id for t in instances if _state(t.state) in {"failed", "upstream_failed"}}
            )
            raise TuningRunError(
                f"{TUNE} run {run_id} ended {_state(run.state)}: failed tasks {', '.join(failed) or 'none'}; "
                f"read their logs in the Airflow UI ({stack.airflow_url}/dags/{TUNE}/runs/{run_id})"
            )
        finished = api.xcom(TUNE, run_id, "finish_study")
    finally:
        api.close()
    # finish_study's `trials` are the counts per state; here `trials` are the slots' records
    counts = finished.pop("trials")
    return {
        "dag_run_id": run_id,
        "status": "ok",
        **finished,
        "trials": trials,
        "trial_counts": counts,
        "most_trials_at_once": most_at_once(trials),
    }


def _state(state: Any) -> str:
    """A run's or task instance's state as its value ("success"); None (not started yet) as "none"."""
    return "none" if state is None else str(getattr(state, "value", state))


def most_at_once(trials: list[dict]) -> int:
    """The most trial tasks that were running at the same moment (from their start and end times)."""
    events: list[tuple[datetime, int]] = []
    for trial in trials:
        if trial.get("started") and trial.get("ended"):
            events += [(trial["started"], 1), (trial["ended"], -1)]
    running = most = 0
    for _, change in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same time
        running += change
        most = max(most, running)
    return most


def print_report(record: dict, console: Console) -> None:
    table = Table(
        "slot", "task", "trial", "state", "epochs", "validation AUC-PR", "parameters", title="trials"
    )
    for trial in record.get("trials", []):
        value = trial.get("value")
        table.add_row(
            str(trial["slot"]),
            trial["task_state"],
            str(trial.get("trial", "")),
            trial.get("state", ""),
            str(trial.get("epochs", "")),
            "" if value is None else f"{value:.4f}",
            ", ".join(f"{k}={v}" for k, v in (trial.get("params") or {}).items()),
        )
    console.print(table)
    if record.get("best_params"):
        console.print(
            f"best: trial {record['best_trial']} of {record['study']}, validation AUC-PR "
            f"{record['best_validation_auc_pr']:.4f}, {record['best_params']}; at most "
            f"{record['most_trials_at_once']} trials ran at once. The next retrain trains with these "
            "(MLOPS_TUNING__USE_BEST_PARAMS=false: with the settings')."
        )
