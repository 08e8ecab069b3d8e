"""Data arrival to a gate decision through Airflow, with the time per stage and Airflow's overhead.

Issue goal: <= 3 min from a day's arrival to the promoted model for 1M rows a day with 30 days of history on
2 cores, and orchestration overhead (wall time minus the time tasks ran) <= 10 %.

How: `mlops demo --days H+1 --rows-per-day R` through Airflow (the real stack: scripts/up.sh, scheduler,
triggerer, LocalExecutor, the Spark Connect server, MLflow) lands H days and lets the chain run on them (the
set-up), then lands one more day. The figure is its `arrival_to_model`: from that day's `_SUCCESS` marker to
the end of the retrain run it started; the union of the chain's task intervals ("busy"); the rest is
orchestration (sensor latency, scheduling, task start-up). Baseline, same run, same data: the same last day
in one process (`mlops demo --in-process`): the stage bodies with no orchestration at all.

Sizes are rows per day (default 1M, the goal's); the history defaults to 30 days (`--history-days`). The
set-up grows with both (every history day goes through ingest, features and a retrain): at the goal's size
it takes hours on 2 cores, so `--sizes 20000 --history-days 4` is the quick look.

Run: `python -m benchmarks --only end_to_end [--sizes 100000] [--history-days 30]`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

DEFAULT_SIZES = [1_000_000]
DEFAULT_HISTORY_DAYS = 30
EPOCHS = 3
STAGES = ("ingest", "features", "retrain")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _demo(home: Path, rows: int, history_days: int, in_process: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLOPS_"))}
    env.update(
        MLOPS_HOME=str(home),
        MLOPS_AIRFLOW_PORT=str(free_port()),
        MLOPS_MLFLOW_PORT=str(free_port()),
        MLOPS_SPARK_CONNECT_PORT=str(free_port()),
        # Labels count as known after 3 days by default: a short history needs them sooner to train at all.
        MLOPS_TRAINING__LABEL_MATURITY_DAYS=str(min(3, history_days - 1)),
    )
    mlops = str(Path(sys.executable).with_name("mlops"))
    command = [mlops, "demo", "--days", str(history_days + 1), "--rows-per-day", str(rows)]
    command += ["--epochs", str(EPOCHS), "--json", "--in-process" if in_process else "--down"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_end_to_end(sizes: list[int], scratch: Path, history_days: int = DEFAULT_HISTORY_DAYS) -> list[dict]:
    if history_days < 2:
        raise SystemExit("--history-days must be at least 2 (a champion first, then the measured day)")
    results = []
    for rows in sizes:
        airflow = _demo(scratch / f"e2e-airflow-{rows}", rows, history_days, in_process=False)
        baseline = _demo(scratch / f"e2e-inprocess-{rows}", rows, history_days, in_process=True)
        arrival, body = airflow["arrival_to_model"], baseline["arrival_to_model"]
        last = airflow["retrains"][-1]
        results.append(
            {
                "benchmark": "arrival -> gate decision",
                "rows_per_day": rows,
                "history_days": history_days,
                "seconds": arrival["seconds"],
                "busy_seconds": arrival["busy_seconds"],
                "overhead_seconds": arrival["overhead_seconds"],
                "overhead_share": arrival["overhead_share"],
                "stage_seconds": arrival["task_seconds_per_stage"],
                "baseline_seconds": body["seconds"],
                "baseline_stage_seconds": body["task_seconds_per_stage"],
                "time_ratio": arrival["seconds"] / body["seconds"],
                "decision": last["decision"],
                "auc_pr": last["auc_pr"],
                "setup_seconds": airflow["seconds"] - arrival["seconds"],
            }
        )
    return results


def print_end_to_end(console: Console, results: list[dict]) -> None:
    table = Table(
        "rows/day", "history", "arrival->decision s", "tasks busy s", "overhead", "in-process s", "ratio",
        *(f"{stage} s (airflow / in-process)" for stage in STAGES), "decision",
        title="end to end: one more day through Airflow vs the same day in one process (goal: <= 180 s at "
        "1M rows/day x 30 days; overhead <= 10%)",
    )  # fmt: skip
    for r in results:
        table.add_row(
            f"{r['rows_per_day']:,}",
            f"{r['history_days']} d",
            f"{r['seconds']:.1f}",
            f"{r['busy_seconds']:.1f}",
            f"{r['overhead_seconds']:.1f} s ({r['overhead_share']:.0%})",
            f"{r['baseline_seconds']:.1f}",
            f"{r['time_ratio']:.2f}x",
            *(
                f"{r['stage_seconds'].get(s, 0):.1f} / {r['baseline_stage_seconds'].get(s, 0):.1f}"
                for s in STAGES
            ),
            str(r["decision"]),
        )
    console.print(table)
