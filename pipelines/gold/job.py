"""Gold feature tables for one date: read the date and its lookback from silver, write the date's gold
partitions (dynamic overwrite), validate them with the gold GX suites."""

from __future__ import annotations

import logging
import os
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from core.errors import PipelineError
from pipelines.gold import state, transforms
from pipelines.gold.contract import (
    CUSTOMER_TABLE,
    LOOKBACK_DAYS,
    MERCHANT_TABLE,
    PARTITION_COLUMN,
    table_path,
    validation_path,
)
from pipelines.lake import Tables, overwrite_partitions, read_partitions, write_json
from pipelines.spark import spark_session
from pipelines.validation import validate

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

REWRITE_BATCH_ROWS = 262_144


def build_gold(settings: Settings, day: date) -> dict:
    """Customer and merchant features for the transactions of `day`: silver rows of event dates D, D-1,
    D-7 and D-30, plus the daily totals of D-30 .. D-1 (state.py), never the whole lookback row by row."""
    tables = Tables(settings.lake)
    spark = spark_session(settings)
    if not Tables.partition(tables.silver, day).is_dir():
        raise PipelineError(
            f"no silver transactions for {day} at {Tables.partition(tables.silver, day)}: ingest the date "
            f"first (`mlops ingest --date {day}`)"
        )
    window_start = day - timedelta(days=LOOKBACK_DAYS)
    arrivals = state.arrivals_with_silver(tables, window_start, day)
    records = state.ensure(spark, settings.lake, arrivals)
    wanted = [day - timedelta(days=k) for k in transforms.ROW_OFFSETS]
    # Events are accepted up to a day late, so a date's rows may sit in the next arrival too.
    row_arrivals = [
        a for a in arrivals if a == day or any(d.isoformat() in records[a]["event_dates"] for d in wanted)
    ]
    silver = read_partitions(spark, tables.silver, row_arrivals)
    assert silver is not None, "`row_arrivals` holds `day`, whose silver partition was checked above"
    evts = transforms.events(silver).where(F.col("event_date").isin(*wanted))
    customer_daily = state.read_table(spark, settings.lake, "customer_daily", arrivals)
    merchant_daily = state.read_table(spark, settings.lake, "merchant_daily", arrivals)
    chargebacks = state.read_table(spark, settings.lake, "merchant_chargebacks", arrivals)
    outputs = {
        CUSTOMER_TABLE: transforms.customer_features(
            evts, transforms.customer_base(customer_daily, day), day
        ),
        MERCHANT_TABLE: transforms.merchant_features(
            evts, chargebacks, transforms.merchant_base(merchant_daily, chargebacks, day), day
        ),
    }
    record: dict[str, Any] = {
        "event_date": day.isoformat(),
        "lookback_from": window_start.isoformat(),
        "silver_arrivals_read": [a.isoformat() for a in row_arrivals],
    }
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
    """Rewrite Spark's files of a gold partition so the same rows give the same bytes and names everywhere.

    Spark names files after a random job id, and parquet-mr writes each column chunk's list of encodings
    in the order of a hash set keyed by identity hash codes, so two JVMs write the same rows with different
    bytes (and different DVC hashes). The files are rewritten, batch by batch, with Arrow's deterministic
    writer (same schema, Spark's schema metadata kept) under names that depend only on their order.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    for index, path in enumerate(sorted(partition.glob("part-*.parquet"))):
        source = pq.ParquetFile(path)
        staged = partition / f".rewrite-{index:05d}.parquet"
        schema = source.schema_arrow
        # Dictionaries only for the entity keys: on float features they cost more than they save.
        keys = [f.name for f in schema if pa.types.is_string(f.type)]
        with pq.ParquetWriter(staged, schema, compression="zstd", use_dictionary=keys) as writer:
            for batch in source.iter_batches(batch_size=REWRITE_BATCH_ROWS):
                writer.write_batch(batch)
        source.close()
        path.unlink()
        os.replace(staged, partition / f"part-{index:05d}.parquet")
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
