"""`version_gold` of one or more dates in one process (`python benchmarks/_version_run.py DATE [DATE ...]`,
with MLOPS_HOME set), as the DAG's version task runs them: the call the task and `mlops features --step
version_gold` make, each timed inside the process (wall seconds, and CPU seconds of the process and its
children). The first call also imports DVC; the interpreter start and the imports before it are timed apart.
Prints one JSON line."""

from __future__ import annotations

import json
import resource
import sys
import time
from datetime import date


def cpu_seconds() -> float:
    """This process's CPU seconds and those of its finished children (DVC once ran as `dvc` processes)."""
    return sum(
        usage.ru_utime + usage.ru_stime
        for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )


if __name__ == "__main__":
    started = time.perf_counter()
    from core.settings import get_settings
    from pipelines.gold.job import version_gold

    settings = get_settings()
    settings.ensure_dirs()

    calls = []
    imported = time.perf_counter()
    for day in sys.argv[1:]:
        wall, cpu = time.perf_counter(), cpu_seconds()
        record = version_gold(settings, date.fromisoformat(day))
        calls.append(
            {
                "seconds": time.perf_counter() - wall,
                "cpu_seconds": cpu_seconds() - cpu,
                "dataset_rev": record["dataset_rev"],
            }
        )
    print(json.dumps({"import_seconds": imported - started, "calls": calls}))
