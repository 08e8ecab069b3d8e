"""Data arrival to a gate decision through Airflow, with the time per stage and Airflow's overhead.

Goals (issue #21): <= 150 s from a day's arrival to the gate's decision for 1M rows a day with 30 days of
history on 2 cores, orchestration overhead (wall time minus the time tasks ran) <= 10 %, and the training
set's build <= 15 s (the `training_set` task: the window's feature rows read, labels joined, versioned).

Set-up (not measured; made once per size and history and kept when `--setup-dir` is given): the history in
bulk in one warm process (benchmarks/_e2e_setup.py: silver by Arrow, then the real features job for every
date and a champion trained as of the last one). Replaying it through Airflow instead would take hours at
the goal's size and measure nothing the last day does not.

Measured: `mlops demo --continue --days 2` on that home through Airflow (the real stack: scripts/up.sh,
scheduler, triggerer, LocalExecutor, the Spark Connect server, MLflow): the next two days of the feed land
and the chain runs on each. The first warms the stack (a production stack has run for days: its Spark
Connect server's JVM is warm, and a cold one makes the first day's tasks far slower); the figure is the
second's `arrival_to_model`: from the day's `_SUCCESS` marker to the end of the retrain run it started; the
union of the chain's task intervals ("busy"); the rest is orchestration (sensor latency, scheduling, task
start-up).
Baseline, same run, same data: the home is put back as the set-up left it and the same two days run in one
process (`mlops demo --continue --days 2 --in-process`): the stage bodies with no orchestration at all, with
the seconds of each features and retrain step of the measured day (`baseline_task_seconds`, named as the
DAGs' tasks), so the two compare task by task.

Before and after, side by side (`--baseline-commit REV`): the same set-up, put back before each run, is run
first by the code of REV (a git worktree of it, run with this checkout's virtual environment: its packages
first on PYTHONPATH, its scripts/ and dags/ from the worktree) and then by this checkout, each through Airflow
and in process, one after the other on the same machine; the table gives each commit's figures per task and
their ratio. The set-up is made by this checkout's code: a baseline must read the same lake layout.

Run: `python -m benchmarks --only end_to_end [--sizes 1000000] [--history-days 30] [--setup-dir DIR]
[--baseline-commit REV]` (`make bench-e2e`); `make bench-e2e-quick` is 200k rows a day over 30 days, whose
whole run takes minutes once its set-up is kept; `--sizes 20000 --history-days 5` is the quick look.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

from rich.console import Console
from rich.table import Table

DEFAULT_SIZES = [1_000_000]
DEFAULT_HISTORY_DAYS = 30
EPOCHS = 3
SEED = 7
START = date(2026, 1, 1)
STAGES = ("ingest", "features", "retrain")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


REPO = Path(__file__).resolve().parents[1]


def _env(home: Path, code: Path | None = None) -> dict[str, str]:
    """The environment of a run on `home`, by this checkout's code or by `code` (a worktree of another commit,
    whose packages then come first on the import path)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "MLOPS_"))}
    env.update(MLOPS_HOME=str(home), MLOPS_PROFILE="local")
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(code), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def checkout(commit: str, scratch: Path) -> Path:
    """The repository at `commit` in a git worktree under `scratch`, with this checkout's virtual environment
    linked in (scripts/up.sh runs `.venv/bin`): the code of a before/after pair's `before`."""
    resolved = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if resolved.returncode:
        raise SystemExit(
            f"--baseline-commit {commit}: not a commit of this repository ({resolved.stderr.strip()})"
        )
    sha = resolved.stdout.strip()
    target = scratch / f"baseline-{sha[:12]}"
    if not target.exists():
        subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", str(target), sha],
            check=True,
            capture_output=True,
        )
    venv = target / ".venv"
    if not venv.exists():
        venv.symlink_to(REPO / ".venv")
    return target


def remove_checkout(target: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(target)], capture_output=True
    )


def _setup(home: Path, rows: int, history_days: int) -> dict:
    """The bulk history under `home` (reused when a finished one is there)."""
    done = home / "e2e-setup.json"
    if done.is_file():
        return {**json.loads(done.read_text()), "reused": True}
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    command = [sys.executable, "-m", "benchmarks._e2e_setup", START.isoformat(), str(history_days), str(rows)]
    started = time.perf_counter()
    ran = subprocess.run([*command, str(SEED), str(EPOCHS)], env=_env(home), capture_output=True, text=True)
    if ran.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{ran.stderr[-4000:]}")
    record = {
        **json.loads(ran.stdout.strip().splitlines()[-1]),
        "wall_seconds": time.perf_counter() - started,
    }
    done.write_text(json.dumps(record) + "\n")
    return record


def _continue(home: Path, rows: int, in_process: bool, code: Path | None = None) -> dict:
    env = _env(home, code)
    env.update(
        MLOPS_AIRFLOW_PORT=str(free_port()),
        MLOPS_MLFLOW_PORT=str(free_port()),
        MLOPS_SPARK_CONNECT_PORT=str(free_port()),
    )
    mlops = str(Path(sys.executable).with_name("mlops"))
    command = [mlops, "demo", "--continue", "--days", "2", "--rows-per-day", str(rows), "--seed", str(SEED)]
    command += ["--epochs", str(EPOCHS), "--json", "--in-process" if in_process else "--down"]
    # Measured is the chain up to the gate; the demo's scoring replay and drift drill come after it and, at
    # 1M rows, would take longer than the chain itself.
    command += ["--no-score", "--no-drift-drill"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=code or REPO)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed (MLOPS_HOME={home}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _restore(home: Path, snapshot: Path) -> None:
    """`home` as the set-up left it (same path: the stores keep absolute paths)."""
    shutil.rmtree(home)
    subprocess.run(["cp", "-a", str(snapshot), str(home)], check=True)  # -a keeps DVC's hard links


def _measure(home: Path, snapshot: Path, rows: int, code: Path | None) -> tuple[dict, dict]:
    """One commit's pair on the set-up: through Airflow, then in one process, the home put back after each."""
    try:
        airflow = _continue(home, rows, in_process=False, code=code)
        _restore(home, snapshot)
        in_process = _continue(home, rows, in_process=True, code=code)
    finally:  # whatever happened, the set-up stays reusable: the stack stopped, the home put back
        subprocess.run(
            ["bash", str((code or REPO) / "scripts" / "down.sh")], env=_env(home, code), capture_output=True
        )
        _restore(home, snapshot)
    return airflow, in_process


def _figures(airflow: dict, baseline: dict) -> dict:
    arrival, body = airflow["arrival_to_model"], baseline["arrival_to_model"]
    last = airflow["retrains"][-1]
    return {
        "seconds": arrival["seconds"],
        "busy_seconds": arrival["busy_seconds"],
        "overhead_seconds": arrival["overhead_seconds"],
        "overhead_share": arrival["overhead_share"],
        "stage_seconds": arrival["task_seconds_per_stage"],
        "task_seconds": arrival["seconds_per_task"],
        "baseline_seconds": body["seconds"],
        "baseline_stage_seconds": body["task_seconds_per_stage"],
        # the features and retrain steps of the baseline's measured day, named as Airflow's tasks
        "baseline_task_seconds": body.get("seconds_per_step", {}),
        "time_ratio": arrival["seconds"] / body["seconds"],
        "decision": last["decision"],
        "auc_pr": last["auc_pr"],
        "baseline_decision": baseline["retrains"][-1]["decision"],
    }


def bench_end_to_end(
    sizes: list[int],
    scratch: Path,
    history_days: int = DEFAULT_HISTORY_DAYS,
    setup_dir: Path | None = None,
    baseline_commit: str | None = None,
) -> list[dict]:
    if history_days < 5:
        raise SystemExit("--history-days must be at least 5 (a champion needs mature labels: 3 days)")
    before_code = checkout(baseline_commit, scratch) if baseline_commit else None
    results = []
    try:
        for rows in sizes:
            results.append(_bench_size(rows, scratch, history_days, setup_dir, baseline_commit, before_code))
    finally:
        if before_code is not None:
            remove_checkout(before_code)
    return results


def _bench_size(
    rows: int,
    scratch: Path,
    history_days: int,
    setup_dir: Path | None,
    baseline_commit: str | None,
    before_code: Path | None,
) -> dict:
    home = (setup_dir or scratch) / f"e2e-{rows}-{history_days}d"
    setup = _setup(home, rows, history_days)
    snapshot = home.with_name(home.name + ".snapshot")
    shutil.rmtree(snapshot, ignore_errors=True)
    subprocess.run(["cp", "-a", str(home), str(snapshot)], check=True)
    try:
        before = _measure(home, snapshot, rows, before_code) if before_code is not None else None
        airflow, baseline = _measure(home, snapshot, rows, None)
    finally:
        shutil.rmtree(snapshot, ignore_errors=True)
    result = {
        "benchmark": "arrival -> gate decision",
        "rows_per_day": rows,
        "history_days": history_days,
        **_figures(airflow, baseline),
        "setup": setup,
    }
    if before is not None:
        result["before"] = {"commit": baseline_commit, **_figures(*before)}
    return result


def print_end_to_end(console: Console, results: list[dict]) -> None:
    table = Table(
        "rows/day", "history", "arrival->decision s", "tasks busy s", "overhead", "in-process s", "ratio",
        *(f"{stage} s (airflow / in-process)" for stage in STAGES), "decision",
        title="end to end: one more day through Airflow vs the same day in one process (goal: <= 150 s at "
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
    for r in results:
        if "before" in r:
            print_before_after(console, r)


def print_before_after(console: Console, r: dict) -> None:
    """Each task's seconds by the baseline commit and by this checkout on the same set-up, and their ratio."""
    before = r["before"]
    table = Table(
        "task", "before: airflow s", "after: airflow s", "after / before", "before: in-process s",
        "after: in-process s", "after / before",
        title=f"{r['rows_per_day']:,} rows/day x {r['history_days']} d: {before['commit']} (before) and this "
        "checkout (after), same set-up, same machine, one after the other",
    )  # fmt: skip

    def ratio(after: float | None, was: float | None) -> str:
        return f"{after / was:.2f}x" if after and was else "-"

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    tasks = sorted({*before["task_seconds"], *r["task_seconds"]})
    for task in tasks:
        was, now = before["task_seconds"].get(task), r["task_seconds"].get(task)
        was_in, now_in = before["baseline_task_seconds"].get(task), r["baseline_task_seconds"].get(task)
        table.add_row(
            task, cell(was), cell(now), ratio(now, was), cell(was_in), cell(now_in), ratio(now_in, was_in)
        )
    table.add_row(
        "arrival -> decision", cell(before["seconds"]), cell(r["seconds"]),
        ratio(r["seconds"], before["seconds"]), cell(before["baseline_seconds"]), cell(r["baseline_seconds"]),
        ratio(r["baseline_seconds"], before["baseline_seconds"]),
    )  # fmt: skip
    console.print(table)
    console.print(f"holdout AUC-PR: before {before['auc_pr']}, after {r['auc_pr']}")
