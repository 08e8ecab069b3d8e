"""Spark's work per step: `python -m benchmarks --only spark_jobs [--sizes 3000] [--baseline-commit REV]`.

The test suite's time and the product's small-date latency follow the number of Spark jobs and Py4J calls a
step makes, not its rows (docs/benchmarks.md, "Test-suite time"). This benchmark counts them for each step of
one day (3,000 rows by default, the demo's size) after an earlier day has been ingested: ingest to bronze with
its quarantine, the GX validations, build_silver, the labels, plan_gold, build_gold, the gold suites, the
training rows. The counts do not move with the machine's speed, so they are the figures to compare; each
step's seconds are printed beside them.

With `--baseline-commit REV` the same landing is run by REV's code first (a git worktree, with this
checkout's virtual environment) and then by this checkout, in fresh homes, and the outputs are compared: the
reconciliation records, the GX results, the gold counts, and a digest of every lake table's rows. A
difference fails the run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
DEFAULT_SIZES = [3_000]
DAY = date(2026, 1, 8)


def _landing(home: Path, rows: int) -> None:
    mlops = str(Path(sys.executable).with_name("mlops"))
    subprocess.run(
        [
            mlops,
            "generate",
            "--start",
            (DAY - timedelta(days=1)).isoformat(),
            "--days",
            "2",
            "--rows-per-day",
            str(rows),
            "--landing",
            str(home / "landing"),
            "--faults",
            "duplicates=0.01,malformed=0.001",
        ],
        check=True,
        capture_output=True,
    )


def _run(code: Path, home: Path, rows: int, key: Path) -> dict:
    """One count by the pipelines of `code` in a fresh `home`, with the pseudonym key `key` (shared by a
    before/after pair: bronze's pseudonyms depend on it)."""
    _landing(home, rows)
    (home / "secrets").mkdir(parents=True)
    shutil.copy(key, home / "secrets" / "pseudonym.key")
    measured = measure(
        [sys.executable, str(HERE / "_spark_jobs_run.py"), str(code), str(home), DAY.isoformat()],
        env=_env(),
    )
    return {**measured["output"], "seconds": measured["seconds"], "peak_mib": measured["peak_mib"]}


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLOPS_"))} | {
        "MLOPS_PROFILE": "local"
    }


def bench_spark_jobs(sizes: list[int], scratch: Path, baseline_commit: str | None = None) -> list[dict]:
    from benchmarks.end_to_end import checkout, remove_checkout
    from core.pseudonym import make_key

    key = scratch / "spark-jobs-pseudonym.key"
    make_key(key)
    results = []
    before_code = checkout(baseline_commit, scratch) if baseline_commit else None
    try:
        for rows in sizes:
            result: dict = {"rows_per_day": rows, "day": DAY.isoformat()}
            if before_code is not None:
                result["before"] = {
                    "commit": baseline_commit,
                    **_run(before_code, scratch / f"before-{rows}", rows, key),
                }
            result["after"] = _run(REPO, scratch / f"after-{rows}", rows, key)
            if before_code is not None:
                result["differences"] = _differences(result["before"], result["after"])
                result["same_outputs"] = not result["differences"]
            results.append(result)
    finally:
        if before_code is not None:
            remove_checkout(before_code)
    for result in results:
        if result.get("same_outputs") is False:
            raise SystemExit(
                f"spark_jobs: the outputs of {baseline_commit} and this checkout differ at "
                f"{result['rows_per_day']} rows a day: {json.dumps(result['differences'])[:3000]}"
            )
    return results


def _differences(before: dict, after: dict) -> dict:
    """Each step's output and each lake table's digest that the two runs do not share."""
    differ = {}
    for kind in ("outputs", "digests"):
        for name in sorted({*before[kind], *after[kind]}):
            if before[kind].get(name) != after[kind].get(name):
                differ[f"{kind}:{name}"] = {"before": before[kind].get(name), "after": after[kind].get(name)}
    return differ


def print_spark_jobs(console: Console, results: list[dict]) -> None:
    for result in results:
        before = result.get("before")
        table = Table(
            "step",
            *(["jobs before", "py4j before", "s before"] if before else []),
            "jobs",
            "py4j calls",
            "seconds",
            *(["jobs ratio", "py4j ratio"] if before else []),
            title=f"Spark work per step, {result['rows_per_day']} rows a day"
            + (f" (before: {before['commit']}; same outputs: {result['same_outputs']})" if before else ""),
        )
        for name, now in result["after"]["steps"].items():
            cells = [name]
            if before:
                was = before["steps"].get(name, {})
                cells += [str(was.get("jobs")), str(was.get("py4j_calls")), f"{was.get('seconds', 0):.2f}"]
            cells += [str(now["jobs"]), str(now["py4j_calls"]), f"{now['seconds']:.2f}"]
            if before:
                cells += [
                    _ratio(now["jobs"], was.get("jobs")),
                    _ratio(now["py4j_calls"], was.get("py4j_calls")),
                ]
            table.add_row(*cells)
        console.print(table)


def _ratio(now: int, was: int | None) -> str:
    return "-" if not was else f"{now / was:.2f}"
