"""Gold feature tables for one date: read the date and its lookback from silver, write the date's gold
partitions (dynamic overwrite), validate them with the gold GX suites."""

from __future__ import annotations

import logging
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.errors import PipelineError
from pipelines.features import transforms
from pipelines.features.contract import (
    CUSTOMER_TABLE,
    LOOKBACK_DAYS,
    MERCHANT_TABLE,
    PARTITION_COLUMN,
    table_path,
    validation_path,
)
from pipelines.ingest.io import Tables, overwrite_partitions, write_json
from pipelines.ingest.validate import validate
from pipelines.spark import spark_session

if TYPE_CHECKING:
    from mlops.settings import Settings

log = logging.getLogger(__name__)


def _partitions(root: Path, first: date, last: date) -> list[str]:
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    return [str(Tables.partition(root, d)) for d in days if Tables.partition(root, d).is_dir()]


def _read(spark: SparkSession, root: Path, first: date, last: date) -> DataFrame | None:
    paths = _partitions(root, first, last)
    return spark.read.option("basePath", str(root)).parquet(*paths) if paths else None


def build_gold(settings: Settings, day: date) -> dict:
    """Customer and merchant features for the transactions of `day`, from silver of day-30 .. day."""
    tables = Tables(settings.lake)
    spark = spark_session(settings)
    if not Tables.partition(tables.silver, day).is_dir():
        raise PipelineError(
            f"no silver transactions for {day} at {Tables.partition(tables.silver, day)}: ingest the date "
            f"first (`mlops ingest --date {day}`)"
        )
    window_start = day - timedelta(days=LOOKBACK_DAYS)
    transactions = _read(spark, tables.silver, window_start, day)
    labels = _read(spark, tables.silver_labels, window_start, day)
    if labels is None:
        chargebacks = spark.createDataFrame([], "merchant_id string, label_timestamp timestamp, is_fraud int")
    else:
        # Chargebacks reported in the window refer to transactions up to 30 days older still.
        merchants = _read(spark, tables.silver, window_start - timedelta(days=LOOKBACK_DAYS), day).select(
            "transaction_id", "merchant_id"
        )
        chargebacks = labels.join(merchants, "transaction_id").select(
            "merchant_id", "label_timestamp", "is_fraud"
        )
    outputs = {
        CUSTOMER_TABLE: transforms.customer_features(transactions, day),
        MERCHANT_TABLE: transforms.merchant_features(transactions, chargebacks, day),
    }
    record = {"event_date": day.isoformat(), "lookback_from": window_start.isoformat()}
    for table, frame in outputs.items():
        root = table_path(settings.lake, table)
        ordered = frame.repartition(1).sortWithinPartitions(*frame.columns[:2])
        overwrite_partitions(ordered, root, [PARTITION_COLUMN], now_empty=(_gold_partition(root, day),))
        written = _gold_partition(root, day)
        _stable_file_names(written)
        record[f"rows_{table}"] = spark.read.parquet(str(written)).count() if written.is_dir() else 0
    silver_rows = spark.read.parquet(str(Tables.partition(tables.silver, day))).count()
    if record[f"rows_{CUSTOMER_TABLE}"] != silver_rows or record[f"rows_{MERCHANT_TABLE}"] != silver_rows:
        raise PipelineError(
            f"gold {day}: {record[f'rows_{CUSTOMER_TABLE}']} customer and {record[f'rows_{MERCHANT_TABLE}']} "
            f"merchant rows for {silver_rows} silver transactions; each transaction needs one row in each"
        )
    log.info("gold %s: %s", day, record)
    return record


def _stable_file_names(partition: Path) -> None:
    """Spark names files after a random job id; a snapshot's content hash covers file names, so gold files
    get names that depend only on their order, and the same data hashes the same way every time."""
    for index, path in enumerate(sorted(partition.glob("part-*.parquet"))):
        path.rename(partition / f"part-{index:05d}.parquet")
    for crc in partition.glob(".part-*.crc"):
        crc.unlink()


def version_gold(settings: Settings, day: date) -> dict:
    """Version the date's gold partitions with DVC (both tables in one commit and one push); returns the
    dataset revision and its members."""
    from pipelines.versioning import record_revision, track_many

    tables = (CUSTOMER_TABLE, MERCHANT_TABLE)
    partitions = [
        (f"gold/{table}/{PARTITION_COLUMN}={day}", _gold_partition(table_path(settings.lake, table), day))
        for table in tables
    ]
    members = dict(zip(tables, track_many(settings, partitions), strict=True))
    rev = record_revision(settings, members)
    return {"dataset_rev": rev, "members": {k: v.md5 for k, v in members.items()}}


def _gold_partition(root: Path, day: date) -> Path:
    return root / f"{PARTITION_COLUMN}={day.isoformat()}"


def validate_gold(settings: Settings, day: date) -> list[dict]:
    spark = spark_session(settings)
    results = []
    for table in (CUSTOMER_TABLE, MERCHANT_TABLE):
        partition = _gold_partition(table_path(settings.lake, table), day)
        df = spark.read.parquet(str(partition)).withColumn(PARTITION_COLUMN, F.lit(day))
        results.append(validate(df, f"gold_{table}", settings.suites_dir, settings.home, {}))
    # Kept for lineage: the model trained on this gold records which suites passed.
    write_json(validation_path(settings.lake, day), {"event_date": day.isoformat(), "results": results})
    return results
