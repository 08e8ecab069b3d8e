"""`python -m orchestration.scheduler`: Airflow's scheduler, with the heavy libraries of the retrain's tasks
imported first (what `make up` runs as the local profile's scheduler).

The LocalExecutor forks its workers from the scheduler, and the supervisor forks each task process from a
worker (airflow/executors/local_executor.py, airflow/sdk/execution_time/supervisor.py), so every task
process starts with what the scheduler imported. The evaluate, promote and export tasks each import torch
and MLflow (register MLflow), seconds of a task process on 2 cores; imported once here, a task finds them
loaded. Only third-party libraries are preloaded: the project's modules are imported fresh by each task, so
an edited task runs its new code without a restart. A library the environment lacks (an image without the
training extra) is skipped, and the log says so.
"""

from __future__ import annotations

import importlib
import logging
import sys

PRELOAD = ("torch", "mlflow", "onnx")

log = logging.getLogger(__name__)


def preload(modules: tuple[str, ...] = PRELOAD) -> list[str]:
    """Import `modules`; return those that were there."""
    loaded = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:  # an environment without the training extra: nothing to share
            log.warning("scheduler preload: %s is not installed (%s); tasks import it themselves", name, exc)
            continue
        loaded.append(name)
    return loaded


def main() -> None:
    preload()
    from airflow.__main__ import main as airflow_main

    sys.argv = ["airflow", "scheduler", *sys.argv[1:]]
    airflow_main()


if __name__ == "__main__":
    main()
