"""One Spark-work count in its own process: `python _spark_jobs_run.py CODE MLOPS_HOME DAY`.

CODE is the checkout whose pipelines run (this one, or a worktree of a baseline commit). The landing under
MLOPS_HOME holds the arrivals of DAY and the day before; the day before is ingested first, uncounted, so the
counted day deduplicates against a real lookback and rebuilds gold from real state. Each step then runs under
a Spark job group of its own name, and the status tracker gives the jobs it started; every Py4J round trip
the step makes (planning a query, reading a result, setting a job group) is counted by wrapping the gateway
connection's send. Prints one JSON line: per step its jobs and Py4J calls, and the outputs (the reconciliation
records, the GX results, the gold counts), so that a before/after pair is seen to produce the same.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import date, timedelta
from pathlib import Path

CALLS = {"n": 0}


def count_py4j() -> None:
    """Count every command sent to the JVM, by either of Py4J's connection classes (pinned-thread mode uses
    the client-server one)."""
    from py4j import clientserver, java_gateway

    for cls in (clientserver.ClientServerConnection, java_gateway.GatewayConnection):
        send = cls.send_command

        def counted(self, command, *args, _send=send, **kwargs):
            CALLS["n"] += 1
            return _send(self, command, *args, **kwargs)

        cls.send_command = counted


def main(code: str, home: str, day: str) -> None:
    sys.path.insert(0, code)
    os.environ["MLOPS_HOME"] = home
    from core.settings import get_settings
    from pipelines.gold import job as gold
    from pipelines.ingest import job
    from pipelines.spark import spark_session

    settings = get_settings()
    counted_day = date.fromisoformat(day)
    spark = spark_session(settings)
    spark.range(10).count()
    import great_expectations  # noqa: F401  (imported before the counts: no Spark work of its own)

    job.ingest(settings, counted_day - timedelta(days=1), "warm-up")
    gold_dates = gold.plan_gold(settings, [counted_day - timedelta(days=1)])["event_dates"]
    for event_date in gold_dates:
        gold.build_gold(settings, date.fromisoformat(event_date))
    count_py4j()
    tracker = spark.sparkContext.statusTracker()
    steps: dict[str, dict] = {}
    outputs: dict[str, object] = {}

    def step(name: str, run):
        spark.sparkContext.setJobGroup(name, name)
        before, started = CALLS["n"], time.perf_counter()
        result = run()
        seconds, calls = time.perf_counter() - started, CALLS["n"] - before
        spark.sparkContext.setJobGroup("between-steps", "between-steps")
        jobs = len(tracker.getJobIdsForGroup(name))
        steps[name] = {"jobs": jobs, "py4j_calls": calls, "seconds": seconds}
        if os.environ.get("SPARK_JOBS_NAMES"):
            store = spark.sparkContext._jsc.sc().statusStore()
            for job_id in sorted(tracker.getJobIdsForGroup(name)):
                data = store.job(job_id)
                print(name, job_id, data.name(), file=sys.stderr)
        outputs[name] = _gx(result)
        return result

    step("ingest_to_bronze", lambda: job.ingest_to_bronze(settings, counted_day, "counted"))
    step("validate_bronze", lambda: _gx(job.validate_bronze(settings, counted_day)))
    step("build_silver", lambda: job.build_silver(settings, counted_day, "counted"))
    step("validate_silver", lambda: _gx(job.validate_silver(settings, counted_day)))
    step("ingest_labels", lambda: job.ingest_labels(settings, counted_day, "counted"))
    plan = step("plan_gold", lambda: gold.plan_gold(settings, [counted_day]))
    step(
        "build_gold",
        lambda: [gold.build_gold(settings, date.fromisoformat(d)) for d in plan["event_dates"]],
    )
    step(
        "validate_gold",
        lambda: [
            [_gx(r) for r in gold.validate_gold(settings, date.fromisoformat(d))] for d in plan["event_dates"]
        ],
    )
    from training.feature_rows import build_feature_rows

    step(
        "feature_rows",
        lambda: _rows(build_feature_rows(settings, [date.fromisoformat(d) for d in plan["event_dates"]])),
    )
    print(json.dumps({"steps": steps, "outputs": outputs, "digests": digests(settings.lake)}, default=str))


def digests(lake: Path) -> dict[str, str]:
    """A digest of the rows of each table of the lake (every folder of Parquet files below it), in a fixed
    order: Spark's file names and row order within a partition may differ between runs, the rows may not."""
    import hashlib

    import pyarrow.dataset as ds

    found = {}
    for path in lake.rglob("*.parquet"):
        if any(part.startswith((".", "_")) for part in path.relative_to(lake).parts):
            continue  # staging, retired versions: not read by any reader
        folder = path.parent
        while "=" in folder.name:
            folder = folder.parent
        found.setdefault(folder, []).append(str(path))
    out = {}
    for folder, files in sorted(found.items()):
        name = str(folder.relative_to(lake))
        dataset = ds.dataset(
            sorted(files), format="parquet", partitioning="hive", partition_base_dir=str(folder)
        )
        rows = dataset.to_table().to_pylist()
        lines = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
        out[name] = f"{len(lines)} rows " + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    return out


def _gx(summary: object) -> object:
    """A step's output without the data docs paths of its GX results (they name the temporary home)."""
    if isinstance(summary, dict):
        return {k: _gx(v) for k, v in summary.items() if k != "data_docs"}
    if isinstance(summary, list):
        return [_gx(v) for v in summary]
    return summary


def _rows(record: dict) -> dict:
    return {k: v for k, v in record.items() if "seconds" not in k}


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
