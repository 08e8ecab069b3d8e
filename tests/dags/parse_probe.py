"""Import one DAG file the way the DAG processor would, with tripwires, and report as JSON.

Run as `python parse_probe.py DAG_FILE`. Tripwires: any socket connection, any SQL statement on any
SQLAlchemy engine, and any Variable or Connection lookup are recorded (and refused). The report lists
them, the heavy modules the file pulled in, the DAG ids it defines, and the file's import time measured
after airflow.sdk itself is loaded (so it is the cost this file adds to every parse).
"""

from __future__ import annotations

import importlib.util
import json
import socket
import sys
import time

HEAVY = ("pyspark", "torch", "mlflow", "feast", "great_expectations", "dvc", "pandas", "sklearn", "onnx")
events: list[str] = []


def _refuse(what: str):
    def tripwire(*args, **kwargs):
        events.append(what)
        raise RuntimeError(f"{what} at DAG parse time")

    return tripwire


def main(path: str) -> None:
    socket.socket.connect = _refuse("socket connect")  # type: ignore[method-assign]
    socket.create_connection = _refuse("socket connect")  # type: ignore[assignment]
    import sqlalchemy.event
    from sqlalchemy.engine import Engine

    sqlalchemy.event.listen(Engine, "before_cursor_execute", lambda *a, **k: events.append("sql statement"))
    import airflow.sdk
    from airflow.sdk import BaseHook, Connection, Variable

    Variable.get = _refuse("Variable.get")  # type: ignore[method-assign]
    Connection.get = _refuse("Connection.get")  # type: ignore[method-assign]
    BaseHook.get_connection = _refuse("BaseHook.get_connection")  # type: ignore[method-assign]
    from airflow.sdk.definitions._internal.contextmanager import DagContext

    before = set(sys.modules)

    started = time.perf_counter()
    spec = importlib.util.spec_from_file_location("dag_under_probe", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    DagContext.current_autoregister_module_name = spec.name  # as the DagBag does for `with DAG(...)`
    spec.loader.exec_module(module)
    seconds = time.perf_counter() - started

    added = set(sys.modules) - before
    heavy = sorted({name.split(".")[0] for name in added if name.split(".")[0] in HEAVY})
    defined = {v for v in vars(module).values() if isinstance(v, airflow.sdk.DAG)}
    defined |= {dag for dag, _ in DagContext.autoregistered_dags}  # `with DAG(...)` blocks
    dag_ids = sorted(dag.dag_id for dag in defined)
    print(json.dumps({"seconds": seconds, "events": events, "heavy_modules": heavy, "dag_ids": dag_ids}))


if __name__ == "__main__":
    main(sys.argv[1])
