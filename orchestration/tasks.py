"""Airflow building blocks shared by the DAG files: the arrival sensor and how a task runs a step.

Imported at DAG parse time, so it imports nothing heavier than the Airflow SDK and the file trigger.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from airflow.providers.standard.triggers.file import FileTrigger
from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

if TYPE_CHECKING:
    from core.settings import Settings

COMPLETE_MARKER = "_SUCCESS"
P = ParamSpec("P")
R = TypeVar("R")


class ArrivalSensor(BaseSensorOperator):
    """Wait until `<landing>/<arrival_date>/_SUCCESS` exists, deferred to the triggerer (no worker slot
    is held while waiting). The landing zone is resolved from the settings when the task runs."""

    template_fields = ("arrival_date",)

    def __init__(self, *, arrival_date: str, **kwargs: Any) -> None:
        # The trigger stats one file in the triggerer's event loop: cheap enough to look every second, so a
        # date's arrival is seen at once (a 30 s interval made this wait most of the chain's scheduling
        # delay, 5 s still half a second to 5 of every arrival's path; measured: see docs/benchmarks.md).
        kwargs.setdefault("poke_interval", 1.0)
        kwargs.setdefault("timeout", timedelta(days=1).total_seconds())
        super().__init__(**kwargs)
        self.arrival_date = arrival_date

    def _marker(self) -> Path:
        from core.settings import get_settings

        return get_settings().landing / self.arrival_date / COMPLETE_MARKER

    def poke(self, context: Any) -> bool:
        return self._marker().is_file()

    def execute(self, context: Any) -> str:
        marker = self._marker()
        if marker.is_file():
            return str(marker)
        self.log.info("waiting for %s (deferred)", marker)
        self.defer(
            trigger=FileTrigger(filepath=str(marker), poke_interval=self.poke_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )
        return str(marker)  # not reached: defer() raises

    def execute_complete(self, context: Any, event: Any = None) -> str:
        return str(self._marker())


# A mapped task instance's name in the grid: its `map_index_template`, rendered from the task's context after
# it runs; the task sets the label from inside (as Airflow documents: a TaskFlow argument is not in the
# template context).
MAP_INDEX_LABEL = "{{ mapped_label }}"
MAP_INDEX_BY_DATE = MAP_INDEX_LABEL  # the features DAG names its instances by date


def label_mapped_task(label: str) -> None:
    """Name this mapped task instance `label` in the grid (its `map_index_template` is MAP_INDEX_LABEL)."""
    from airflow.sdk import get_current_context

    get_current_context()["mapped_label"] = label  # type: ignore[typeddict-unknown-key]


def label_mapped_date(day: str) -> None:
    """Name a mapped task instance by its date in the grid (MAP_INDEX_BY_DATE)."""
    label_mapped_task(day)


def run_step(step: Callable[Concatenate[Settings, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Call one typed step (`step(settings, *args)`) with the task's settings and its directories made,
    under the task error policy of `fail_fast_on_bad_data`. DAG tasks pass the function itself, so a reader
    (or "find usages") goes straight from a task to the code it runs."""
    from core.settings import get_settings

    settings = get_settings()
    settings.ensure_dirs()
    return fail_fast_on_bad_data(lambda: step(settings, *args, **kwargs))


@contextmanager
def lower_cpu_priority(niceness: int) -> Iterator[int]:
    """Run the block at `niceness` (added to the thread's own; 0: unchanged) and yield the niceness in effect.

    For work off the critical path that shares the machine's cores with work on it (the online load beside
    the retrain): the kernel's scheduler then gives the cores to the other tasks first, and this one runs on
    what they leave, without waiting for them as a pool slot would. Linux sets a niceness per thread and a
    thread starts with its creator's, so the threads the block starts (Arrow's, SQLite's) run at it too and
    keep it. At the end the thread's niceness is put back where the process may raise its priority (root,
    CAP_SYS_NICE: a test calling the task in process); elsewhere it stays, in a task process about to end."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    if niceness > 0:
        os.setpriority(os.PRIO_PROCESS, 0, min(19, before + niceness))
    try:
        yield os.getpriority(os.PRIO_PROCESS, 0)
    finally:
        if niceness > 0:
            # An unprivileged process cannot raise its priority again: a task process, which ends soon.
            with suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, 0, before)


def training_set_or_skip(build: Callable[[Settings, date], dict], as_of: str, ti: Any) -> dict:
    """`build(settings, as_of)` (training/steps.py dataset), for the retrain and tuning DAGs. When there is
    nothing to train on yet (the first days of a feed) the task is skipped, with the reason in its log and
    its `skipped` XCom, and so is everything after it."""
    from airflow.sdk.exceptions import AirflowSkipException

    from training.dataset import NothingToTrainError

    def build_or_skip(settings: Settings, day: date) -> dict:
        try:
            return build(settings, day)
        except NothingToTrainError as exc:
            ti.xcom_push(key="skipped", value=str(exc))  # the reason, for the UI and `mlops demo`
            raise AirflowSkipException(str(exc)) from exc

    return run_step(build_or_skip, date.fromisoformat(as_of))


def fail_fast_on_bad_data(step: Callable[[], R]) -> R:
    """Run a pipeline step; a data problem fails the task without retries (retrying cannot fix the data),
    while anything else (a lost executor, a full disk, a DVC repository still busy after its wait:
    LockTimeoutError) keeps the task's retries."""
    from core.errors import PipelineError

    try:
        return step()
    except PipelineError as exc:
        raise AirflowFailException(str(exc)) from exc


# --- asset-triggered runs: which dates, and why a run started ---------------------------------------------


def event_dates(events: Iterable[Any]) -> list[str]:
    """The dates asset events name in their `extra`: `event_dates` (a list, what the features DAG and the
    scoring service post), `days` (the drift event's) or `date`; sorted, each once."""
    found: set[str] = set()
    for event in events:
        extra = getattr(event, "extra", None) or {}
        found.update(extra.get("event_dates") or [])
        found.update(extra.get("days") or [])
        if extra.get("date"):
            found.add(extra["date"])
    return sorted(found)


def dates_from_param_or_events(param: str, triggering_asset_events: Mapping[Any, Any] | None) -> list[str]:
    """The dates a run works on: the comma-separated `param` of a manual run, else the dates its triggering
    asset events name (every asset's). Raises RunParameterError (a ValueError, and a PipelineError: the task
    fails at once, without retries) when there are none, or a date is malformed."""
    from datetime import date

    from core.errors import RunParameterError

    if param:
        dates = sorted({d.strip() for d in param.split(",") if d.strip()})
    else:
        events = triggering_asset_events or {}
        dates = event_dates(e for asset in events for e in events[asset])
    if not dates:
        raise RunParameterError(
            "no date to work on: the run has no triggering event naming one and no date param"
        )
    for value in dates:
        try:
            date.fromisoformat(value)
        except ValueError:
            raise RunParameterError(
                f"{value!r} is not a date; give YYYY-MM-DD, several comma-separated"
            ) from None
    return dates


def start_reason(
    triggering_asset_events: Mapping[Any, Any] | None,
    run_type: Any = "",
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Why a run started, for a person: each triggering asset event as a phrase (a drift event by its
    `summary`, e.g. "drift: log_amount_usd PSI 0.43 KS 0.31; ...", a features event as "fraud_features
    of 2026-01-10"), or the schedule, or a manual trigger with its params; and the events themselves."""
    run_type = str(getattr(run_type, "value", run_type) or "")  # the Task SDK's DagRunType prints its name
    events = triggering_asset_events or {}
    phrases: list[str] = []
    triggers: list[dict[str, Any]] = []
    for asset in events:
        for event in events[asset]:
            extra = dict(getattr(event, "extra", None) or {})
            name = getattr(asset, "name", str(asset))
            if extra.get("summary"):
                phrases.append(str(extra["summary"]))
            elif event_dates([event]):
                phrases.append(f"{name} of {', '.join(event_dates([event]))}")
            else:
                phrases.append(f"an event of {name}")
            triggers.append(
                {
                    "asset": name,
                    "source_dag_id": getattr(event, "source_dag_id", None),
                    "source_run_id": getattr(event, "source_run_id", None),
                    "timestamp": str(getattr(event, "timestamp", "")),
                    "extra": extra,
                }
            )
    if not phrases and run_type == "scheduled":
        phrases.append("the time schedule")
    elif not phrases:
        given = {k: v for k, v in (params or {}).items() if v}
        phrases.append(f"{run_type or 'manual'} run" + (f" with {given}" if given else ""))
    return {"reason": "; ".join(phrases), "triggers": triggers}


MONITORING_COMMAND = ("python", "-m", "monitoring")
BATCH_SCORING_COMMAND = ("python", "-m", "serving.batch")


def cpu_pod_operator(
    settings: Settings,
    task_id: str,
    pod_name: str,
    command: Sequence[str],
    arguments: list[str],
    *,
    promoter: bool = False,
    writable: Sequence[str] = (),
    **operator_args: Any,
):
    """A CPU pod of the training image running `command arguments` (MLflow, onnxruntime, scikit-learn, SciPy:
    the Airflow image has none of them), with the step pods' hardening, settings and read-only shared volume;
    its result comes back through the pod results table (core/pod_results.py). `promoter`: with the
    promoter's identity (it writes the promotion history). `writable`: folders under the shared volume
    (relative to it) the pod may write, each mounted read-write on its own; the rest stays read-only."""
    from orchestration import k8s_contract as contract
    from orchestration.training_task import _pod_operator, pod_environment

    manifest = contract.training_pod_manifest(
        pod_name, settings.training.image, arguments, step=True, env=pod_environment(settings)
    )
    manifest["spec"]["containers"][0]["command"] = list(command)
    for folder in writable:
        contract.writable_folder(manifest, folder)
    if promoter:
        contract.as_promoter(manifest)
    timeout = timedelta(seconds=manifest["spec"]["activeDeadlineSeconds"])
    return _pod_operator(settings, task_id, manifest, execution_timeout=timeout, **operator_args)


def monitor_pod_operator(settings: Settings, dates: str, **operator_args: Any):
    """The cluster profile's monitoring check: `python -m monitoring check --dates ...` as a CPU pod, with the
    promoter's identity (a rollback writes the promotion history). `dates`: comma-separated, usually a
    template of an upstream XCom."""
    arguments = ["check", "--dates", dates, "--dag-id", "{{ dag.dag_id }}", "--dag-run-id", "{{ run_id }}"]
    return cpu_pod_operator(
        settings, "check", "fraud-monitor", MONITORING_COMMAND, arguments, promoter=True, **operator_args
    )
