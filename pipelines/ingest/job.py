"""Ingestion steps for one arrival date. The Airflow tasks and `mlops ingest` call these same functions.

Each step reads and writes only its date's partitions, so any step can be rerun alone.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from core import lineage, pseudonym
from core.errors import (
    EmptyArrivalError,
    LandingFileError,
    PipelineError,
    QuarantineRateError,
)
from pipelines.contracts import LABEL_COLUMNS, TRANSACTION_COLUMNS
from pipelines.ingest import transforms
from pipelines.ingest.landing import (
    Arrival,
    LandingFile,
    find_arrival,
    json_key_problems,
    number_lines,
    read_lines,
    read_splits,
    refuse_to_clear,
)
from pipelines.ingest.schemas import BRONZE_TRANSACTIONS, SILVER_TRANSACTIONS
from pipelines.ingest.transforms import KEY_MASK
from pipelines.lake import (
    Tables,
    clear_partitions,
    overwrite_partitions,
    parquet_rows,
    read_json,
    read_partition,
    read_partitions,
    value_counts,
    write_json,
)
from pipelines.spark import spark_session
from pipelines.validation import validate

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)
ROWS_PER_SILVER_FILE = 2_000_000


def _landed(settings: Settings, day: date, record: dict) -> list[lineage.Dataset]:
    return [lineage.path(settings.landing / day.isoformat() / name) for name in record.get("files", [])]


def _bronze_lineage(settings: Settings, record: dict, day: date, run_id: str) -> lineage.Datasets:
    tables = Tables(settings.lake)
    return lineage.Datasets(
        _landed(settings, day, record),
        [
            lineage.path(Tables.partition(tables.bronze, day), rows=record.get("rows_bronze", 0)),
            lineage.path(
                Tables.partition(tables.quarantine, day, stage="bronze"),
                rows=record.get("rows_quarantined", 0),
            ),
        ],
    )


def _validation_lineage(settings: Settings, record: dict, day: date) -> lineage.Datasets:
    layer = record["suite"].split("_", 1)[0]
    tables = Tables(settings.lake)
    partition = lineage.path(Tables.partition(tables.bronze if layer == "bronze" else tables.silver, day))
    return lineage.Datasets([lineage.validated(partition, record)])


def _silver_lineage(settings: Settings, record: dict, day: date, run_id: str) -> lineage.Datasets:
    tables = Tables(settings.lake)
    lookback = [day - timedelta(days=k) for k in range(settings.ingest.dedup_lookback_days + 1)]
    read = [Tables.partition(tables.bronze, d) for d in lookback]
    written = [day, *map(date.fromisoformat, record.get("rebuilt_arrivals", []))]
    return lineage.Datasets(
        [lineage.path(p) for p in read if p.is_dir()],
        [
            *(lineage.path(Tables.partition(tables.silver, d)) for d in written),
            *(lineage.path(Tables.partition(tables.quarantine, d, stage="silver")) for d in written),
        ],
    )


def _labels_lineage(settings: Settings, record: dict, day: date, run_id: str) -> lineage.Datasets:
    tables = Tables(settings.lake)
    return lineage.Datasets(
        _landed(settings, day, record),
        [
            lineage.path(Tables.partition(tables.silver_labels, day), rows=record.get("rows_silver")),
            lineage.path(
                Tables.partition(tables.quarantine_labels, day), rows=record.get("rows_quarantined")
            ),
        ],
    )


@lineage.emits("ingest_to_bronze", _bronze_lineage)
def ingest_to_bronze(settings: Settings, day: date, run_id: str) -> dict:
    """Landing files of `day` -> bronze (typed) and quarantine (with reasons); write the reconciliation."""
    tables = Tables(settings.lake)
    arrival = find_arrival(settings.landing, day, ignore=settings.ingest.ignore_files)
    spark = spark_session(settings)
    with_rows = [f for f in arrival.files if f.name not in arrival.empty_files]
    if with_rows:
        arrival.problems += [
            f"{name}: empty file (no rows) in an arrival that has data; a truncated upload? have it resent"
            for name in arrival.empty_files
        ]
    # Unusable files stop the date before anything is written, even when no other file has rows: an
    # arrival that only looks empty must not clear what an earlier run wrote.
    if arrival.problems:
        raise LandingFileError(day.isoformat(), arrival.problems)
    if not with_rows:
        return _empty_arrival(settings, tables, arrival, run_id)

    pseudonyms = pseudonym.for_settings(settings)  # before any write: no key, nothing past landing
    classify = functools.partial(transforms.classify, arrival=day, late_days=settings.ingest.late_event_days)
    stored, rows, lines_in = _classified_lines(spark, arrival, with_rows, TRANSACTION_COLUMNS, classify)
    try:
        bronze_partition = Tables.partition(tables.bronze, day)
        quarantine_partition = Tables.partition(tables.quarantine, day, stage="bronze")
        # A partition this run writes no row to is emptied, not left as an earlier run wrote it.
        overwrite_partitions(
            transforms.to_bronze(rows, day, run_id, pseudonyms),
            tables.bronze,
            ["arrival_date"],
            now_empty=(bronze_partition,),
        )
        overwrite_partitions(
            transforms.to_quarantine(rows, day, run_id),
            tables.quarantine,
            ["arrival_date", "stage"],
            now_empty=(quarantine_partition,),
        )
    finally:
        stored.unpersist()

    # Counts are read back from what was written (Parquet footers and the small quarantine's reasons, with
    # Arrow: no Spark job): the record states what is on disk, and every line read must be there once.
    rows_bronze = parquet_rows(bronze_partition)
    by_reason = {str(reason): n for reason, n in value_counts(quarantine_partition, "reason").items()}
    rows_quarantined = sum(by_reason.values())
    rows_in = rows_bronze + rows_quarantined
    if rows_in != lines_in:
        raise PipelineError(
            f"arrival {day}: {lines_in} data lines were read, but bronze holds {rows_bronze} rows and "
            f"quarantine {rows_quarantined}; rows were lost or doubled. Rerun ingest_to_bronze."
        )
    record: dict[str, Any] = {
        "arrival_date": day.isoformat(),
        "run_id": run_id,
        "status": "bronze",
        "files": [f.name for f in arrival.files],
        "rows_in": rows_in,
        "rows_bronze": rows_bronze,
        "rows_quarantined": rows_quarantined,
        "quarantined_by_reason": {r: by_reason.get(r, 0) for r in transforms.ROW_REASONS},
        "quarantine_rate": rows_quarantined / rows_in,
        "pseudonym_key_id": pseudonyms.key_id,
    }
    write_json(tables.reconciliation(day), record)
    log.info("reconciliation %s: %s", day, record)
    limit = settings.ingest.max_quarantine_rate
    if record["quarantine_rate"] > limit:
        ranked = sorted(record["quarantined_by_reason"].items(), key=lambda kv: -kv[1])[:3]
        worst = ", ".join(f"{reason}={count}" for reason, count in ranked if count)
        raise QuarantineRateError(
            f"arrival {day}: {rows_quarantined} of {rows_in} rows quarantined "
            f"({record['quarantine_rate']:.2%}), above the limit of {limit:.2%}; top reasons: {worst}. "
            f"Inspect {Tables.partition(tables.quarantine, day)}; fix the feed and rerun the date, or raise "
            f"MLOPS_INGEST__MAX_QUARANTINE_RATE if this is expected."
        )
    return record


def _classified_lines(
    spark: SparkSession,
    arrival: Arrival,
    files: list[LandingFile],
    columns: tuple[str, ...],
    classify: Callable[[DataFrame], DataFrame],
) -> tuple[DataFrame, DataFrame, int]:
    """Every data line of `files` classified, each file's text read once: (the persisted classified rows,
    to unpersist when done; those rows numbered, the CSV header lines left out; the number of data lines).

    The text is read, parsed and classified in one pass, split by split in parallel, and the result kept
    on disk: both tables are written from it, and the count of each split's lines, taken from it, gives
    the line numbers (`landing.number_lines`). Raises LandingFileError for a JSON file that lacks a column,
    before anything is written.
    """
    stored = classify(_parse_arrival(spark, arrival, files, columns))
    if columns == TRANSACTION_COLUMNS:
        # A clean row lands typed in bronze: only a quarantined one needs its raw record on disk.
        stored = stored.withColumn("raw_record", F.when(F.col("reason").isNotNull(), F.col("raw_record")))
    stored = stored.persist(StorageLevel.DISK_ONLY)
    try:
        splits, key_masks = read_splits(stored, KEY_MASK if KEY_MASK in stored.columns else None)
        keys = {name: transforms.json_keys_seen(mask, columns) for name, mask in key_masks.items()}
        problems = json_key_problems(files, keys, columns)
        if problems:
            raise LandingFileError(arrival.day.isoformat(), problems)
    except BaseException:
        stored.unpersist()
        raise
    csv_names = [f.name for f in files if f.fmt == "csv"]
    numbered = number_lines(stored, splits).where(
        ~(F.col("source_file").isin(csv_names) & (F.col("line_number") == 1))
    )
    return stored, numbered, sum(s.lines for s in splits) - len(csv_names)


def _parse_arrival(
    spark: SparkSession, arrival: Arrival, files: list[LandingFile], columns: tuple[str, ...]
) -> DataFrame:
    """String columns of every line of `files` (`landing.read_lines`, not numbered yet): CSV files grouped
    by header (their header lines included, to be left out once numbered), JSON Lines as they are. Each
    group reads only its own files."""
    parsed: list[DataFrame] = []
    csv_files = [f for f in files if f.fmt == "csv"]
    for header in sorted({tuple(arrival.headers[f.name]) for f in csv_files}):
        group = [f for f in csv_files if tuple(arrival.headers[f.name]) == header]
        parsed.append(transforms.parse_csv_lines(read_lines(spark, group), list(header), columns))
    json_files = [f for f in files if f.fmt == "json"]
    if json_files:
        parsed.append(transforms.parse_json_lines(read_lines(spark, json_files), columns))
    return functools.reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parsed)


def _empty_arrival(settings: Settings, tables: Tables, arrival: Arrival, run_id: str) -> dict:
    """An arrival with no rows at all: clear the date's partitions, say so, fail only if configured. A date
    the lake holds rows of is not cleared (its files were lost) unless MLOPS_INGEST__ALLOW_EMPTY_OVERWRITE."""
    day, files = arrival.day, [f.name for f in arrival.files]
    roots = {"bronze": tables.bronze, "silver": tables.silver, "quarantine": tables.quarantine}
    cleared = refuse_to_clear(
        arrival.folder,
        "transactions",
        {name: Tables.partition(root, day) for name, root in roots.items()},
        tables.reconciliation(day),
        arrival.empty_files,
        allow=settings.ingest.allow_empty_overwrite,
    )
    for root in roots.values():
        clear_partitions(root, (Tables.partition(root, day),))
    record = {
        "arrival_date": day.isoformat(),
        "run_id": run_id,
        "status": "empty",
        "files": files,
        "rows_in": 0,
        "rows_bronze": 0,
        "rows_quarantined": 0,
        "quarantined_by_reason": {r: 0 for r in transforms.ROW_REASONS},
        "quarantine_rate": 0.0,
        "rows_silver": 0,
        "duplicates_removed": 0,
    }
    if cleared:
        record["cleared_rows"] = cleared
    write_json(tables.reconciliation(day), record)
    message = f"arrival {day} is empty: {len(files)} file(s) with no rows ({', '.join(files) or 'no files'})"
    log.warning(message)
    if settings.ingest.fail_on_empty_arrival:
        raise EmptyArrivalError(message + "; set MLOPS_INGEST__FAIL_ON_EMPTY_ARRIVAL=false to accept it")
    return record


@lineage.emits("validate_bronze", _validation_lineage)
def validate_bronze(settings: Settings, day: date) -> dict:
    return _validate(settings, day, "bronze")


@lineage.emits("validate_silver", _validation_lineage)
def validate_silver(settings: Settings, day: date) -> dict:
    return _validate(settings, day, "silver")


def _validate(settings: Settings, day: date, layer: str) -> dict:
    tables = Tables(settings.lake)
    record = _reconciliation(tables, day)
    if record["status"] == "empty":
        return {"suite": f"{layer}_transactions", "skipped": "empty arrival"}
    count_key = "rows_bronze" if layer == "bronze" else "rows_silver"
    previous = read_json(tables.reconciliation(day - timedelta(days=1)))
    if previous and previous.get(count_key):
        bounds = {
            "min_rows": math.floor(previous[count_key] * settings.ingest.row_count_min_ratio),
            "max_rows": math.ceil(previous[count_key] * settings.ingest.row_count_max_ratio),
        }
    else:
        bounds = {"min_rows": 1, "max_rows": 10**12}
    root = tables.bronze if layer == "bronze" else tables.silver
    schema = BRONZE_TRANSACTIONS if layer == "bronze" else SILVER_TRANSACTIONS
    df = _read_rows(spark_session(settings), root, day, record[count_key], schema)
    return validate(df, f"{layer}_transactions", settings.home, bounds)


def _read_rows(spark: SparkSession, root: Path, day: date, rows: int, schema: StructType) -> DataFrame:
    """The date's partition of `root`; none is written when the record counts no rows (every row of the
    arrival was quarantined), so an empty frame then, for the gates to judge."""
    if rows == 0 and not Tables.partition(root, day).is_dir():
        return spark.createDataFrame([], schema)
    return read_partition(spark, root, day, schema)


@lineage.emits("build_silver", _silver_lineage)
def build_silver(settings: Settings, day: date, run_id: str) -> dict:
    """Bronze of `day` -> silver (deduplicated against itself and the bronze of the arrivals of the
    lookback, sorted), removed copies -> quarantine; update the record.

    Silver of a date depends only on bronze of [date - lookback, date], so when `day` arrives after a later
    date was built, the later dates whose silver holds a copy of one of `day`'s ids (or lost a copy `day`
    no longer has) are rebuilt the same way; the record lists them as `rebuilt_arrivals`.
    """
    tables = Tables(settings.lake)
    record = _reconciliation(tables, day)
    if record["status"] == "empty":
        return record
    record.update(_write_silver(settings, tables, day, run_id, record), status="silver")
    rebuilt = []
    for later in _later_arrivals_to_rebuild(settings, tables, day):
        later_record = _reconciliation(tables, later)
        later_record.update(_write_silver(settings, tables, later, run_id, later_record))
        later_record["rebuilt_after_arrival"] = day.isoformat()
        write_json(tables.reconciliation(later), later_record)
        log.info("rebuilt silver of %s after arrival %s: %s", later, day, later_record)
        rebuilt.append(later.isoformat())
    record["rebuilt_arrivals"] = rebuilt
    write_json(tables.reconciliation(day), record)
    log.info("reconciliation %s: %s", day, record)
    return record


def _write_silver(settings: Settings, tables: Tables, day: date, run_id: str, record: dict) -> dict:
    """Silver and silver-stage quarantine of `day`, deterministic from bronze; the counts written."""
    spark = spark_session(settings)
    lookback = settings.ingest.dedup_lookback_days
    days = [day - timedelta(days=k) for k in range(1, lookback + 1)]
    earlier = read_partitions(spark, tables.bronze, days, BRONZE_TRANSACTIONS)
    kept: list[DataFrame] = []

    def keep(ranked: DataFrame) -> DataFrame:
        kept.append(ranked.persist(StorageLevel.DISK_ONLY))
        return kept[-1]

    silver, duplicates = transforms.deduplicate(
        _read_rows(spark, tables.bronze, day, record["rows_bronze"], BRONZE_TRANSACTIONS),
        run_id,
        None
        if earlier is None
        else earlier.select("transaction_id", "arrival_date", "source_file", "line_number"),
        # ranked once and kept on disk: the duplicates and silver are both written from it
        keep=keep,
    )
    try:
        return _write_deduplicated(spark, tables, day, record, silver, duplicates)
    finally:
        for frame in kept:
            frame.unpersist()


def _write_deduplicated(
    spark: SparkSession, tables: Tables, day: date, record: dict, silver: DataFrame, duplicates: DataFrame
) -> dict:
    files = max(1, math.ceil(record["rows_bronze"] / ROWS_PER_SILVER_FILE))
    ordered = silver.repartitionByRange(files, "event_timestamp", "transaction_id").sortWithinPartitions(
        "event_timestamp", "transaction_id"
    )
    # Counts are read back from what was written: the record states what is on disk.
    duplicates_partition = Tables.partition(tables.quarantine, day, stage="silver")
    overwrite_partitions(
        duplicates, tables.quarantine, ["arrival_date", "stage"], now_empty=(duplicates_partition,)
    )
    removed = parquet_rows(duplicates_partition)
    silver_partition = Tables.partition(tables.silver, day)
    # Every row quarantined or a resend: the date's silver is emptied, not left as an earlier run wrote it.
    overwrite_partitions(ordered, tables.silver, ["arrival_date"], now_empty=(silver_partition,))
    rows_silver = parquet_rows(silver_partition)
    if rows_silver + removed != record["rows_bronze"]:
        raise PipelineError(
            f"arrival {day}: silver has {rows_silver} rows and {removed} duplicates were removed, but bronze "
            f"has {record['rows_bronze']}; rows were lost between bronze and silver. Rerun build_silver."
        )
    return {"rows_silver": rows_silver, "duplicates_removed": removed}


def _later_arrivals_to_rebuild(settings: Settings, tables: Tables, day: date) -> list[date]:
    """Later arrivals within the lookback whose silver `day`'s bronze changes: their silver holds an id of
    `day` (now the later copy), or they removed a copy as a resend of a row `day` no longer has."""
    lookback = settings.ingest.dedup_lookback_days
    later = [
        day + timedelta(days=k)
        for k in range(1, lookback + 1)
        if Tables.partition(tables.silver, day + timedelta(days=k)).is_dir()
    ]
    if not later:
        return []
    spark = spark_session(settings)
    ids = _read_rows(spark, tables.bronze, day, 0, BRONZE_TRANSACTIONS).select("transaction_id")
    silver = read_partitions(spark, tables.silver, later, SILVER_TRANSACTIONS)
    shadowed = (
        {
            r.arrival_date
            for r in silver.join(ids, "transaction_id", "left_semi")
            .select("arrival_date")
            .distinct()
            .collect()
        }
        if silver is not None
        else set()
    )
    stages = [p for d in later if (p := Tables.partition(tables.quarantine, d, stage="silver")).is_dir()]
    orphaned: set[date] = set()
    if stages:
        copies = spark.read.option("basePath", str(tables.quarantine)).parquet(*map(str, stages))
        pointing = copies.where(F.col("detail").startswith(f"transaction_id first seen in arrival {day} "))
        orphaned = {
            r.arrival_date
            for r in pointing.join(ids, "transaction_id", "left_anti")
            .select("arrival_date")
            .distinct()
            .collect()
        }
    return sorted(shadowed | orphaned)


def _reconciliation(tables: Tables, day: date) -> dict:
    record = read_json(tables.reconciliation(day))
    if record is None:
        raise PipelineError(
            f"arrival {day} has no reconciliation record at {tables.reconciliation(day)}: run the ingest "
            f"step (`mlops ingest --date {day}`) first"
        )
    return record


@lineage.emits("ingest_labels", _labels_lineage)
def ingest_labels(settings: Settings, day: date, run_id: str) -> dict:
    """Chargebacks reported on `day` -> silver labels (first copy of a transaction_id wins) and quarantine.
    A header-only labels file is normal: no chargeback was reported that day."""
    tables = Tables(settings.lake)
    arrival = find_arrival(
        settings.landing, day, stem="labels", columns=LABEL_COLUMNS, ignore=settings.ingest.ignore_files
    )
    spark = spark_session(settings)
    with_rows = [f for f in arrival.files if f.name not in arrival.empty_files]
    if arrival.problems:
        raise LandingFileError(day.isoformat(), arrival.problems)
    record: dict[str, Any] = {
        "arrival_date": day.isoformat(),
        "run_id": run_id,
        "files": [f.name for f in arrival.files],
    }
    silver_partition = Tables.partition(tables.silver_labels, day)
    quarantine_partition = Tables.partition(tables.quarantine_labels, day)
    if not with_rows:
        cleared = refuse_to_clear(
            arrival.folder,
            "labels",
            {"silver": silver_partition, "quarantine": quarantine_partition},
            tables.labels_reconciliation(day),
            arrival.empty_files,
            allow=settings.ingest.allow_empty_overwrite,
        )
        clear_partitions(tables.silver_labels, (silver_partition,))
        clear_partitions(tables.quarantine_labels, (quarantine_partition,))
        record.update(
            rows_in=0, rows_silver=0, rows_quarantined=0, duplicates_removed=0, quarantined_by_reason={}
        )
        if cleared:
            record["cleared_rows"] = cleared
        write_json(tables.labels_reconciliation(day), record)
        return record
    classify = functools.partial(
        transforms.classify_labels, arrival=day, late_days=settings.ingest.late_event_days
    )
    stored, classified, rows_in = _classified_lines(spark, arrival, with_rows, LABEL_COLUMNS, classify)
    # Only clean rows compete to be the first copy: a row quarantined for a bad value shadows no label.
    clean = F.col("reason").isNull()
    order = Window.partitionBy("transaction_id", clean).orderBy("source_file", "line_number")
    first_copy = F.first(F.concat_ws(":", "source_file", F.col("line_number").cast("string"))).over(order)
    # Ranked once, kept on disk: the quarantine and the silver labels are both written from it.
    ranked = (
        classified.withColumn("_copy", F.when(clean, F.row_number().over(order)))
        .withColumn(
            "detail",
            F.when(
                F.col("_copy") > 1, F.concat(F.lit("transaction_id first seen at "), first_copy)
            ).otherwise(F.col("detail")),
        )
        .persist(StorageLevel.DISK_ONLY)
    )
    try:
        return _write_labels(settings, tables, day, run_id, record, ranked, rows_in)
    finally:
        ranked.unpersist()
        stored.unpersist()


def _write_labels(
    settings: Settings, tables: Tables, day: date, run_id: str, record: dict, ranked: DataFrame, rows_in: int
) -> dict:
    """The quarantine of a labels arrival, its counts (read from what was written) and gate, then its silver
    labels and their suite."""
    spark = spark_session(settings)
    silver_partition = Tables.partition(tables.silver_labels, day)
    quarantine_partition = Tables.partition(tables.quarantine_labels, day)
    clean = F.col("reason").isNull()
    rejected = ranked.where(~clean | (F.col("_copy") > 1)).select(
        F.coalesce("reason", F.lit("duplicate")).alias("reason"), *transforms.rejection_columns(run_id, day)
    )
    labels = ranked.where(F.col("_copy") == 1).select(
        "transaction_id",
        "is_fraud",
        "label_timestamp",
        "source_file",
        "line_number",
        F.lit(day).alias("arrival_date"),
    )
    # The rejected rows are kept either way, to be inspected; silver labels only when the gate passes. The
    # counts come from the written quarantine: every row of it but a duplicate's copy failed a rule.
    overwrite_partitions(
        rejected, tables.quarantine_labels, ["arrival_date"], now_empty=(quarantine_partition,)
    )
    by_reason = {
        str(r): n for r, n in value_counts(quarantine_partition, "reason").items() if r != "duplicate"
    }
    rows_quarantined = sum(by_reason.values())
    record.update(
        rows_in=rows_in,
        rows_quarantined=rows_quarantined,
        quarantined_by_reason=by_reason,
        quarantine_rate=rows_quarantined / rows_in,
    )
    limit = settings.ingest.max_label_quarantine_rate
    if record["quarantine_rate"] > limit:
        record["status"] = "failed"
        write_json(tables.labels_reconciliation(day), record)
        ranked_reasons = sorted(record["quarantined_by_reason"].items(), key=lambda kv: -kv[1])[:3]
        worst = ", ".join(f"{reason}={count}" for reason, count in ranked_reasons)
        raise QuarantineRateError(
            f"labels arrival {day}: {rows_quarantined} of {rows_in} rows quarantined "
            f"({record['quarantine_rate']:.2%}), above the limit of {limit:.2%}; top reasons: {worst}. "
            f"Silver labels of the date were not written. Inspect {quarantine_partition}; fix the feed "
            f"and rerun the date, or raise MLOPS_INGEST__MAX_LABEL_QUARANTINE_RATE if this is expected."
        )
    overwrite_partitions(labels, tables.silver_labels, ["arrival_date"], now_empty=(silver_partition,))
    rows_silver = parquet_rows(silver_partition)
    kept_in_quarantine = parquet_rows(quarantine_partition)
    if rows_silver + kept_in_quarantine != rows_in:
        raise PipelineError(
            f"labels arrival {day}: {rows_in} rows in, but silver labels hold {rows_silver} and quarantine "
            f"{kept_in_quarantine} (duplicates included); rows were lost or doubled. Rerun ingest_labels."
        )
    duplicates = rows_in - rows_quarantined - rows_silver
    record.update(status="ok", rows_silver=rows_silver, duplicates_removed=duplicates)
    write_json(tables.labels_reconciliation(day), record)
    if rows_silver:
        df = read_partition(spark, tables.silver_labels, day, labels.schema)
        record["validation"] = validate(df, "silver_labels", settings.home, {})
        write_json(tables.labels_reconciliation(day), record)
    log.info("labels reconciliation %s: %s", day, record)
    return record


def ingest(settings: Settings, day: date, run_id: str) -> dict:
    """All steps in order: bronze and quarantine, validate bronze, silver, validate silver, labels."""
    record = ingest_to_bronze(settings, day, run_id)
    if record["status"] == "empty":
        labels = ingest_labels(settings, day, run_id)
        return {
            **record,
            "validation": [],
            "labels": {k: labels[k] for k in ("rows_in", "rows_silver", "rows_quarantined")},
        }
    checks = [validate_bronze(settings, day)]
    record = build_silver(settings, day, run_id)
    checks.append(validate_silver(settings, day))
    record = {**record, "status": "ok", "validation": checks}
    write_json(Tables(settings.lake).reconciliation(day), record)
    labels = ingest_labels(settings, day, run_id)
    return {**record, "labels": {k: labels[k] for k in ("rows_in", "rows_silver", "rows_quarantined")}}
