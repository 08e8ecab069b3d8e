"""Airflow building blocks shared by the DAG files: the arrival sensor and how a task runs a step.

Imported at DAG parse time, so it imports nothing heavier than the Airflow SDK and the file trigger.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
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
        # The trigger stats one file in the triggerer's event loop: cheap enough to look every 5 s, so a
        # date's arrival is seen within seconds (a 30 s interval made this wait most of the chain's
        # scheduling delay; measured: see docs/benchmarks.md).
        kwargs.setdefault("poke_interval", 5.0)
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


MAP_INDEX_BY_DATE = "{{ mapped_date }}"


def label_mapped_date(day: str) -> None:
    """Name a mapped task instance by its date in the grid: its `map_index_template` is
    `MAP_INDEX_BY_DATE`, rendered from the task's context after it runs (set from inside the task, as
    Airflow documents, since a TaskFlow argument is not in the template context)."""
    from airflow.sdk import get_current_context

    get_current_context()["mapped_date"] = day  # type: ignore[typeddict-unknown-key]


def run_step(step: Callable[Concatenate[Settings, P], R], *args: P.args, **kwargs: P.kwargs) -> R:
    """Call one typed step (`step(settings, *args)`) with the task's settings and its directories made,
    under the task error policy of `fail_fast_on_bad_data`. DAG tasks pass the function itself, so a reader
    (or "find usages") goes straight from a task to the code it runs."""
    from core.settings import get_settings

    settings = get_settings()
    settings.ensure_dirs()
    return fail_fast_on_bad_data(lambda: step(settings, *args, **kwargs))


def fail_fast_on_bad_data(step: Callable[[], R]) -> R:
    """Run a pipeline step; a data problem fails the task without retries (retrying cannot fix the data),
    while anything else (a lost executor, a full disk, a DVC repository still busy after its wait:
    LockTimeoutError) keeps the task's retries."""
    from core.errors import PipelineError

    try:
        return step()
    except PipelineError as exc:
        raise AirflowFailException(str(exc)) from exc
