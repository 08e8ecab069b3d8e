"""The gold benchmarks' runs, each a process of its own (`python -m benchmarks._gold_run MODE HOME ...`).

lookback HOME FIRST LAST REPEATS: warm Spark and GX up (a build of FIRST, unmeasured: JVM start, JIT and
imports are fixed costs, not the cost of a date), then time build_gold and validate_gold of FIRST and LAST,
alternated REPEATS times, and LAST's floor (`_floor_build`) as often; prints the medians as one JSON line.
history HOME FIRST LAST [DAY ...]: derive the daily totals of FIRST .. LAST, then forget those of DAY ...
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


def _silver_rows(home: Path, arrivals: list[str]) -> int:
    import pyarrow.parquet as pq

    silver = home / "lake" / "silver" / "transactions"
    return sum(
        pq.read_metadata(path).num_rows
        for a in arrivals
        for path in (silver / f"arrival_date={a}").glob("*.parquet")
    )


def lookback(home: Path, first: date, last: date, repeats: int) -> dict:
    """Steady state: the daily totals of every earlier arrival exist (derived once, unmeasured), and each
    timed build derives its own arrival's totals, as a date's first build does in production."""
    from core.settings import get_settings
    from mlops.chain import FEATURES_STEPS
    from pipelines.gold import state
    from pipelines.lake import Tables
    from pipelines.spark import spark_session

    settings = get_settings()
    FEATURES_STEPS["build_gold"](settings, first)
    FEATURES_STEPS["validate_gold"](settings, first)
    history = state.arrivals_with_silver(Tables(settings.lake), first, last - timedelta(days=1))
    state.ensure(spark_session(settings), settings.lake, history)
    seconds: dict[date, dict[str, list[float]]] = {
        d: {"build_gold": [], "validate_gold": []} for d in (first, last)
    }
    read: dict[date, list[str]] = {}
    for _ in range(repeats):
        for day in (first, last):
            state.forget(settings.lake, day)
            for step in ("build_gold", "validate_gold"):
                started = time.perf_counter()
                record = FEATURES_STEPS[step](settings, day)
                seconds[day][step].append(time.perf_counter() - started)
                read.setdefault(day, record.get("silver_arrivals_read"))
    floors = [_floor_build(settings, last, read[last]) for _ in range(repeats)]
    timings = {
        day.isoformat(): {
            **{step: statistics.median(samples) for step, samples in steps.items()},
            "silver_rows_read": _silver_rows(home, read[day]),
        }
        for day, steps in seconds.items()
    }
    timings[last.isoformat()]["floor"] = statistics.median(floors)
    return timings


def _floor_build(settings, day: date, arrivals: list[str]) -> float:
    """What any gold build of `day` does whatever its features: read the same silver rows (event dates D,
    D-1, D-7 and D-30 of the same arrivals), shuffle them by customer and by merchant, sort each by time
    and write D's rows of each table as one sorted file. No feature, no daily totals, no Arrow rewrite."""
    import shutil

    from pyspark.sql import functions as F

    from pipelines.gold.transforms import ROW_OFFSETS
    from pipelines.lake import Tables, read_partitions
    from pipelines.spark import spark_session

    spark = spark_session(settings)
    wanted = [day - timedelta(days=k) for k in ROW_OFFSETS]
    silver = read_partitions(spark, Tables(settings.lake).silver, [date.fromisoformat(a) for a in arrivals])
    rows = silver.where(F.col("event_date").isin(*wanted))
    scratch = settings.home / "bench-floor"
    started = time.perf_counter()
    for key in ("customer_id", "merchant_id"):
        keyed = rows.repartition(key).sortWithinPartitions(key, "event_timestamp")
        day_rows = keyed.where(F.col("event_date") == F.lit(day)).repartition(1).sortWithinPartitions(key)
        day_rows.write.mode("overwrite").parquet(str(scratch / key))
    seconds = time.perf_counter() - started
    shutil.rmtree(scratch)
    return seconds


def floor() -> dict:
    from core.settings import get_settings
    from pipelines.spark import spark_session

    spark = spark_session(get_settings())
    return {"rows": spark.range(1000).count()}


def history(first: date, last: date, forget: list[date]) -> dict:
    """Derive the daily totals of arrivals first .. last, then forget those of `forget` (dates about to be
    measured derive their own, as in production)."""
    from core.settings import get_settings
    from pipelines.gold import state
    from pipelines.lake import Tables
    from pipelines.spark import spark_session

    settings = get_settings()
    arrivals = state.arrivals_with_silver(Tables(settings.lake), first, last)
    state.ensure(spark_session(settings), settings.lake, arrivals)
    for day in forget:
        state.forget(settings.lake, day)
    return {"arrivals": len(arrivals)}


if __name__ == "__main__":
    mode, home = sys.argv[1], Path(sys.argv[2])
    os.environ["MLOPS_HOME"] = str(home)
    if mode == "lookback":
        first, last = date.fromisoformat(sys.argv[3]), date.fromisoformat(sys.argv[4])
        print(json.dumps(lookback(home, first, last, int(sys.argv[5]))))
    elif mode == "history":
        first, last = date.fromisoformat(sys.argv[3]), date.fromisoformat(sys.argv[4])
        print(json.dumps(history(first, last, [date.fromisoformat(d) for d in sys.argv[5:]])))
    else:
        print(json.dumps(floor()))
