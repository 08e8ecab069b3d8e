"""DAG file parse time above a bare DAG file (goal: <= 0.5 s a file).

Each file of dags/ is parsed by Airflow's DagBag in a fresh interpreter with Airflow already imported
(_dag_parse_run.py), so the figure is what the file itself costs on every parse: its top-level code and
its imports. The baseline is a DAG file with one task and no imports beyond airflow.sdk, parsed the same
way in the same run; median of `REPEATS`.

Run: `python -m benchmarks --only dag_parse`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DAGS = HERE.parent / "dags"
REPEATS = 5
BARE_DAG = """from datetime import datetime

from airflow.sdk import dag, task


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False)
def bare():
    @task
    def noop() -> None:
        pass

    noop()


bare()
"""


def _parse(path: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks._dag_parse_run", str(path)],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_dag_parse(sizes: list[int], scratch: Path) -> list[dict]:
    bare = scratch / "bare_dag.py"
    bare.write_text(BARE_DAG)
    files = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
    samples: dict[Path, list[float]] = {p: [] for p in [bare, *files]}
    dags: dict[Path, list[str]] = {}
    for _ in range(REPEATS):  # interleaved, so a busy moment weighs on every file alike
        for path in samples:
            run = _parse(path)
            if run["errors"]:
                raise SystemExit(f"{path.name} has import errors: {run['errors']}")
            samples[path].append(run["seconds"])
            dags[path] = run["dags"]
    base = statistics.median(samples[bare])
    return [
        {
            "file": path.name,
            "dags": ", ".join(dags[path]),
            "seconds": statistics.median(samples[path]),
            "bare_seconds": base,
            "above_bare": statistics.median(samples[path]) - base,
        }
        for path in files
    ]


def print_dag_parse(console, results: list[dict]) -> None:
    from rich.table import Table

    table = Table(
        "file",
        "DAGs",
        "parse s",
        "bare DAG s",
        "above bare s",
        title=f"DAG file parse time (DagBag, Airflow imported), median of {REPEATS} "
        "(goal: <= 0.5 s above bare)",
    )
    for r in results:
        table.add_row(
            r["file"], r["dags"], f"{r['seconds']:.3f}", f"{r['bare_seconds']:.3f}", f"{r['above_bare']:.3f}"
        )
    console.print(table)
