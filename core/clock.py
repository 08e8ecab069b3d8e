"""Seconds per named step, summed when a name comes again: what the demo reports per stage, and the
features and retrain records per step (named as the DAGs' tasks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class StageClock:
    """Seconds per stage, summed over calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, stage: str, step: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        result = step()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started
        return result
