"""One ingestion benchmark run in its own process: `python _ingest_run.py MLOPS_HOME DATE`.

Starts Spark and imports GX first (JVM start and imports are fixed costs, not throughput), then, in the same
session, runs each path twice: a plain Spark CSV -> Parquet conversion of the arrival's files with the
contract's explicit schema (the baseline), landing -> bronze (the second run replaces what the first wrote),
the GX bronze suite, and hand-written checks computing the same statistics in one Spark aggregation; then
bronze -> silver against its floor (the same bronze rows read, range-sorted and written as silver files, with
no deduplication, quarantine or counts read back). The
first run of each pays its share of the JIT compilation of a fresh driver; the second is the steady state
of a warm one (a long-lived Spark Connect server). Prints one JSON line with both.
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
    """The statistics the bronze suite checks, computed in a single aggregation pass: the row count, nulls
    of the columns that must have values, and per contract rule the rows that break it (range, allowed
    values, pattern, length). Column types are the schema's, read without a pass."""
    from pipelines.contracts import TRANSACTIONS_CONTRACT

    required = [*TRANSACTIONS_CONTRACT.required, "source_file", "line_number", "arrival_date"]
    aggregates = [F.count("*").alias("rows")]
    aggregates += [F.sum(F.col(c).isNull().cast("long")).alias(f"null_{c}") for c in required]
    for f in TRANSACTIONS_CONTRACT.fields:
        value = F.col(f.name)
        if f.minimum is not None and f.maximum is not None:
            low = value <= f.minimum if f.min_exclusive else value < f.minimum
            high = value >= f.maximum if f.max_exclusive else value > f.maximum
            aggregates.append(F.sum((low | high).cast("long")).alias(f"out_of_range_{f.name}"))
        if f.allowed is not None:
            aggregates.append(F.sum((~value.isin(*f.allowed)).cast("long")).alias(f"outside_{f.name}"))
        # bronze's values: an identifier's pseudonym (core/pseudonym.py), as the suite checks
        if f.kind == "string" and f.stored_pattern is not None:
            unmatched = ~value.rlike(f.stored_pattern)
            aggregates.append(F.sum(unmatched.cast("long")).alias(f"unmatched_{f.name}"))
        if f.stored_max_length is not None:
            too_long = ~F.length(value).between(1, f.stored_max_length)
            aggregates.append(F.sum(too_long.cast("long")).alias(f"length_{f.name}"))
    return df.agg(*aggregates).first().asDict()


def spark_csv_to_parquet(spark, folder: Path, out: Path) -> float:
    """The baseline: Spark's own CSV reader with the contract's types given (no inferSchema) and a Parquet
    write of the same files, nothing else (no quarantine, line numbers or checks). Seconds taken."""
    from pyspark.sql.types import StructType

    from pipelines.contracts import TRANSACTION_COLUMNS
    from pipelines.ingest.schemas import BRONZE_TRANSACTIONS

    schema = StructType([BRONZE_TRANSACTIONS[c] for c in TRANSACTION_COLUMNS])
    paths = [str(p) for p in sorted(folder.glob("transactions-*.csv"))]
    started = time.perf_counter()
    spark.read.schema(schema).option("header", True).csv(paths).write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


def silver_floor(bronze, rows: int, out: Path) -> float:
    """The floor of build_silver: the arrival's bronze rows in silver's order and files, written; no
    deduplication against the lookback, no quarantine, no counts read back. Seconds taken."""
    from pipelines.ingest.job import ROWS_PER_SILVER_FILE

    files = max(1, -(-rows // ROWS_PER_SILVER_FILE))
    started = time.perf_counter()
    order = ("event_timestamp", "transaction_id")
    ordered = bronze.repartitionByRange(files, *order).sortWithinPartitions(*order)
    ordered.write.mode("overwrite").parquet(str(out))
    return time.perf_counter() - started


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

    folder, baseline_out = settings.landing / day, Path(home) / "spark-csv-parquet"
    bronze = Tables(settings.lake).bronze
    runs: dict[str, list[float]] = {
        "spark_csv": [],
        "bronze": [],
        "gx": [],
        "hand": [],
        "silver": [],
        "silver_floor": [],
    }
    record: dict = {}
    for _ in range(2):
        runs["spark_csv"].append(spark_csv_to_parquet(spark, folder, baseline_out))
        started = time.perf_counter()
        record = job.ingest_to_bronze(settings, arrival, "bench")
        runs["bronze"].append(time.perf_counter() - started)
    for _ in range(2):
        started = time.perf_counter()
        job.validate_bronze(settings, arrival)
        runs["gx"].append(time.perf_counter() - started)
        started = time.perf_counter()
        stats = hand_written_checks(read_partition(spark, bronze, arrival))
        runs["hand"].append(time.perf_counter() - started)
        assert stats["rows"] == record["rows_bronze"]
    for _ in range(2):
        rows = read_partition(spark, bronze, arrival)
        runs["silver_floor"].append(silver_floor(rows, record["rows_bronze"], Path(home) / "silver-floor"))
        started = time.perf_counter()
        job.build_silver(settings, arrival, "bench")
        runs["silver"].append(time.perf_counter() - started)
    print(json.dumps({"rows_in": record["rows_in"], **{f"{name}_seconds": t for name, t in runs.items()}}))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main(sys.argv[1], sys.argv[2])
