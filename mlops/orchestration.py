"""Airflow building blocks shared by the DAG files: the arrival sensor and the task error policy.

Imported at DAG parse time, so it imports nothing heavier than the Airflow SDK and the file trigger.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.providers.standard.triggers.file import FileTrigger
from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

COMPLETE_MARKER = "_SUCCESS"


class ArrivalSensor(BaseSensorOperator):
    """Wait until `<landing>/<arrival_date>/_SUCCESS` exists, deferred to the triggerer (no worker slot
    is held while waiting). The landing zone is resolved from the settings when the task runs."""

    template_fields = ("arrival_date",)

    def __init__(self, *, arrival_date: str, **kwargs: Any) -> None:
        # The trigger stats one file in the triggerer's event loop: cheap enough to look every 5 s, and
        # a date's arrival is seen 2.5 s later on average (30 s made it most of the chain's scheduling delay).
        kwargs.setdefault("poke_interval", 5.0)
        kwargs.setdefault("timeout", timedelta(days=1).total_seconds())
        super().__init__(**kwargs)
        self.arrival_date = arrival_date

    def _marker(self) -> Path:
        from mlops.settings import get_settings

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


def fail_fast_on_bad_data(step: Callable[[], dict]) -> dict:
    """Run a pipeline step; a data problem fails the task without retries (retrying cannot fix the data),
    while anything else (a lost executor, a full disk) keeps the task's retries."""
    from pipelines.errors import PipelineError

    try:
        return step()
    except PipelineError as exc:
        raise AirflowFailException(str(exc)) from exc
