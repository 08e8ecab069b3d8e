"""The gold benchmarks' runs, each a process of its own (`python -m benchmarks._gold_run MODE HOME ...`).

lookback HOME FIRST LAST REPEATS: warm Spark and GX up (a build of FIRST, unmeasured: JVM start, JIT and
imports are fixed costs, not the cost of a date), then time build_gold and validate_gold of FIRST and LAST,
alternated REPEATS times; prints the medians as one JSON line.
floor HOME: start the SparkSession the jobs use and run a trivial job (the memory floor).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from datetime import date, timedelta
from pathlib import Path


def _silver_rows(home: Path, day: date) -> int:
    import pyarrow.parquet as pq

    from pipelines.features.contract import LOOKBACK_DAYS

    silver = home / "lake" / "silver" / "transactions"
    days = [day - timedelta(days=i) for i in range(LOOKBACK_DAYS + 1)]
    return sum(
        pq.read_metadata(path).num_rows
        for d in days
        for path in (silver / f"arrival_date={d.isoformat()}").glob("*.parquet")
    )


def lookback(home: Path, first: date, last: date, repeats: int) -> dict:
    from mlops.jobs import features_step

    features_step("build_gold", first)
    features_step("validate_gold", first)
    seconds: dict[date, dict[str, list[float]]] = {
        d: {"build_gold": [], "validate_gold": []} for d in (first, last)
    }
    for _ in range(repeats):
        for day in (first, last):
            for step in ("build_gold", "validate_gold"):
                started = time.perf_counter()
                features_step(step, day)
                seconds[day][step].append(time.perf_counter() - started)
    return {
        day.isoformat(): {
            **{step: statistics.median(samples) for step, samples in steps.items()},
            "silver_rows_read": _silver_rows(home, day),
        }
        for day, steps in seconds.items()
    }


def floor() -> dict:
    from mlops.settings import get_settings
    from pipelines.spark import spark_session

    spark = spark_session(get_settings())
    return {"rows": spark.range(1000).count()}


if __name__ == "__main__":
    mode, home = sys.argv[1], Path(sys.argv[2])
    os.environ["MLOPS_HOME"] = str(home)
    if mode == "lookback":
        first, last = date.fromisoformat(sys.argv[3]), date.fromisoformat(sys.argv[4])
        print(json.dumps(lookback(home, first, last, int(sys.argv[5]))))
    else:
        print(json.dumps(floor()))
