"""One ingestion benchmark run in its own process: `python _ingest_run.py MLOPS_HOME DATE`.

Warms Spark and GX up first (JVM start and imports are fixed costs, not throughput), then times
landing -> bronze, the GX bronze suite, and hand-written checks computing the same statistics in one
Spark aggregation. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import date
from pathlib import Path

from pyspark.sql import functions as F


def hand_written_checks(df) -> dict:
    """The statistics the bronze suite needs, computed in a single aggregation pass."""
    from pipelines.contracts import REQUIRED_TRANSACTION_COLUMNS
    from pipelines.ingest.transforms import ALLOWED_VALUES

    required = [*REQUIRED_TRANSACTION_COLUMNS, "source_file", "line_number", "arrival_date"]
    aggregates = [F.count("*").alias("rows")]
    aggregates += [F.sum(F.col(c).isNull().cast("long")).alias(f"null_{c}") for c in required]
    aggregates += [F.min("amount").alias("amount_min"), F.max("amount").alias("amount_max")]
    aggregates += [
        F.sum((~F.col(c).isin(*allowed)).cast("long")).alias(f"outside_{c}")
        for c, allowed in ALLOWED_VALUES.items()
    ]
    aggregates.append(
        F.sum((~F.col("transaction_id").rlike("^tx[0-9a-f]{16}$")).cast("long")).alias("bad_ids")
    )
    return df.agg(*aggregates).first().asDict()


def main(home: str, day: str) -> None:
    os.environ["MLOPS_HOME"] = home
    from core.settings import get_settings
    from pipelines.ingest import job
    from pipelines.lake import Tables, read_partition
    from pipelines.spark import spark_session

    settings = get_settings()
    arrival = date.fromisoformat(day)
    spark = spark_session(settings)
    spark.range(1000).count()
    import great_expectations  # noqa: F401  (import cost is not validation cost)

    started = time.perf_counter()
    record = job.ingest_to_bronze(settings, arrival, "bench")
    bronze_seconds = time.perf_counter() - started

    started = time.perf_counter()
    job.validate_bronze(settings, arrival)
    gx_seconds = time.perf_counter() - started

    started = time.perf_counter()
    stats = hand_written_checks(read_partition(spark, Tables(settings.lake).bronze, arrival))
    hand_seconds = time.perf_counter() - started
    assert stats["rows"] == record["rows_bronze"]
    print(
        json.dumps(
            {
                "rows_in": record["rows_in"],
                "bronze_seconds": bronze_seconds,
                "gx_seconds": gx_seconds,
                "hand_seconds": hand_seconds,
            }
        )
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(sys.argv[1], sys.argv[2])
