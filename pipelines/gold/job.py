"""Gold feature tables for one date: read the date and its lookback from silver, write the date's gold
partitions (dynamic overwrite), validate them with the gold GX suites."""

from __future__ import annotations

import logging
import os
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from core import lineage
from core.errors import PipelineError
from pipelines.gold import state, transforms
from pipelines.gold.contract import (
    CUSTOMER_TABLE,
    FEATURES_FORMAT,
    LOOKBACK_DAYS,
    MERCHANT_TABLE,
    PARTITION_COLUMN,
    build_path,
    builds_root,
    gold_revision_path,
    table_path,
    validation_path,
)
from pipelines.ingest.schemas import SILVER_TRANSACTIONS
from pipelines.lake import (
    Tables,
    clear_partitions,
    overwrite_partitions,
    parquet_rows,
    read_json,
    read_partitions,
    write_json,
)
from pipelines.spark import spark_session
from pipelines.suites import gold_suite_name
from pipelines.validation import validate

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

REWRITE_BATCH_ROWS = 262_144


def inputs_of(records: dict[date, dict], day: date) -> dict[str, str]:
    """The arrivals the gold of event date `day` reads (rows or totals of event dates D-30 .. D, or
    chargebacks reported then), each with the signature of its silver and labels."""
    window = {day - timedelta(days=k) for k in range(LOOKBACK_DAYS + 1)}
    return {
        arrival.isoformat(): record["signature"]
        for arrival, record in sorted(records.items())
        if state.dates_of(record) & window
    }


def plan_gold(settings: Settings, arrivals: list[date]) -> dict:
    """The gold event dates to (re)build now that `arrivals` reached silver, reconciled by event date.

    An arrival holds events of its own date and up to `late_event_days` before it, so it adds rows to
    earlier event dates; and the features of a date read the 30 days before it, so a change to event date
    E changes every gold date in E .. E+30 that exists. Rather than reason from the triggering arrivals
    alone, each gold date records the arrivals it was built from (with a signature of their files): a
    date is rebuilt when those inputs differ now (a late event, an out-of-order arrival, a re-delivery or
    a rerun of an old date, a resend quarantined in a later arrival), plus the event dates of `arrivals`
    themselves. Returns the dates, oldest first, and why each is in the list."""
    tables = Tables(settings.lake)
    with_silver = state.arrivals_with_silver(tables)
    gone = state.prune(settings.lake, with_silver)
    records = state.ensure(spark_session(settings), settings.lake, with_silver)
    reasons: dict[date, str] = {}
    for arrival in arrivals:
        if arrival not in records:  # its build_gold fails alone, naming the date, and the others go on
            reasons[arrival] = f"arrival {arrival} has no silver transactions"
            continue
        for event_date in sorted(records[arrival]["event_dates"]):
            reasons.setdefault(date.fromisoformat(event_date), f"events of arrival {arrival}")
    builds = builds_root(settings.lake)
    for path in sorted(builds.glob(f"{PARTITION_COLUMN}=*.json")) if builds.is_dir() else []:
        built = read_json(path) or {}
        day = date.fromisoformat(path.stem.removeprefix(f"{PARTITION_COLUMN}="))
        if day not in reasons and built.get("inputs") != inputs_of(records, day):
            changed = sorted(set(built.get("inputs", {}).items()) ^ set(inputs_of(records, day).items()))
            reasons[day] = "inputs changed: arrivals " + ", ".join(sorted({a for a, _ in changed}))
        # A date built for other declarations (a feature added or changed) is built again: the backfill of
        # a new feature, oldest first. A record from before the format was kept counts as today's.
        elif (
            day not in reasons
            and not built.get("removed")
            and built.get("features", FEATURES_FORMAT) != FEATURES_FORMAT
        ):
            reasons[day] = "declared features changed (pipelines/gold/contract.py FEATURES)"
    plan = {
        "arrivals": [a.isoformat() for a in arrivals],
        "event_dates": [d.isoformat() for d in sorted(reasons)],
        "reasons": {d.isoformat(): why for d, why in sorted(reasons.items())},
        "arrivals_removed": [a.isoformat() for a in gone],
    }
    log.info("gold plan: %s", plan)
    return plan


def gold_partitions(settings: Settings, day: date) -> dict[str, Path]:
    """The date's gold partition of each table (which may not exist)."""
    return {t: _gold_partition(table_path(settings.lake, t), day) for t in (CUSTOMER_TABLE, MERCHANT_TABLE)}


def _gold_lineage(settings: Settings, record: dict, day: date) -> lineage.Datasets:
    tables = Tables(settings.lake)
    arrivals = sorted({*record.get("silver_arrivals_read", []), *record.get("state_arrivals", [])})
    read = [
        Tables.partition(root, date.fromisoformat(a))
        for a in arrivals
        for root in (tables.silver, tables.silver_labels)
    ]
    return lineage.Datasets(
        [lineage.path(p) for p in read if p.is_dir()],
        [lineage.path(p, rows=record.get(f"rows_{t}")) for t, p in gold_partitions(settings, day).items()],
    )


def _gold_validation_lineage(settings: Settings, results: list[dict], day: date) -> lineage.Datasets:
    by_suite = {r["suite"]: r for r in results}
    return lineage.Datasets(
        [
            lineage.validated(lineage.path(p), by_suite[gold_suite_name(t)])
            for t, p in gold_partitions(settings, day).items()
            if gold_suite_name(t) in by_suite
        ]
    )


def _version_lineage(settings: Settings, record: dict, day: date) -> lineage.Datasets:
    if not record.get("dataset_rev"):
        return lineage.Datasets()
    partitions = gold_partitions(settings, day)
    return lineage.Datasets(
        [lineage.path(partitions[t], version=md5) for t, md5 in record["members"].items()],
        [lineage.dvc_revision(settings, f"gold/{PARTITION_COLUMN}={day.isoformat()}", record["dataset_rev"])],
    )


@lineage.emits("build_gold", _gold_lineage)
def build_gold(settings: Settings, day: date) -> dict:
    """Customer and merchant features for the transactions of event date `day`, from every arrival that
    holds rows of it (late events included): silver rows of event dates D, D-1, D-7 and D-30, plus the
    daily totals of D-30 .. D-1 (state.py), never the whole lookback row by row."""
    tables = Tables(settings.lake)
    spark = spark_session(settings)
    window_start = day - timedelta(days=LOOKBACK_DAYS)
    # An arrival holds events of up to `late_event_days` before its own date.
    arrivals = state.arrivals_with_silver(
        tables, window_start, day + timedelta(days=settings.ingest.late_event_days)
    )
    records = state.ensure(spark, settings.lake, arrivals)
    expected = sum(r["event_dates"].get(day.isoformat(), 0) for r in records.values())
    roots = [table_path(settings.lake, t) for t in (CUSTOMER_TABLE, MERCHANT_TABLE)]
    if expected == 0:
        return _no_events(settings, tables, day, roots, inputs_of(records, day))
    wanted = [day - timedelta(days=k) for k in transforms.ROW_OFFSETS]
    row_arrivals = [a for a in arrivals if any(d.isoformat() in records[a]["event_dates"] for d in wanted)]
    silver = read_partitions(spark, tables.silver, row_arrivals, SILVER_TRANSACTIONS)
    assert silver is not None, "`row_arrivals` holds the rows of `day`, counted above"
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
        # the arrivals whose daily totals (state.py) went into the features
        "state_arrivals": [a.isoformat() for a in arrivals],
        "silver_rows": expected,
    }
    for table, frame in outputs.items():
        root = table_path(settings.lake, table)
        ordered = frame.repartition(1).sortWithinPartitions(*frame.columns[:2])
        written = _gold_partition(root, day)
        # File names are made stable in staging, before the swap: the live partition is never half-rewritten.
        overwrite_partitions(
            ordered, root, [PARTITION_COLUMN], now_empty=(written,), before_swap=_stable_file_names
        )
        record[f"rows_{table}"] = parquet_rows(written)  # from the footers of what was written
    if record[f"rows_{CUSTOMER_TABLE}"] != expected or record[f"rows_{MERCHANT_TABLE}"] != expected:
        raise PipelineError(
            f"gold {day}: {record[f'rows_{CUSTOMER_TABLE}']} customer and {record[f'rows_{MERCHANT_TABLE}']} "
            f"merchant rows for {expected} silver transactions of event date {day} (arrivals "
            f"{', '.join(record['silver_arrivals_read'])}); each transaction needs one row in each"
        )
    write_json(
        build_path(settings.lake, day),
        {"event_date": day.isoformat(), "inputs": inputs_of(records, day), "features": FEATURES_FORMAT},
    )
    log.info("gold %s: %s", day, record)
    return record


def _no_events(
    settings: Settings, tables: Tables, day: date, roots: list[Path], inputs: dict[str, str]
) -> dict:
    """No silver row has event date `day`: an error for a date never built, and the removal of its gold
    when rows it was built from are gone (a re-delivery that retracted them)."""
    partitions = [_gold_partition(root, day) for root in roots]
    if not any(p.is_dir() for p in partitions):
        raise PipelineError(
            f"no silver transactions with event date {day} under {tables.silver}: ingest the date first "
            f"(`mlops ingest --date {day}`)"
        )
    for root, partition in zip(roots, partitions, strict=True):
        clear_partitions(root, (partition,))
    write_json(
        build_path(settings.lake, day), {"event_date": day.isoformat(), "inputs": inputs, "removed": True}
    )
    log.warning("gold %s removed: no silver transaction has this event date any more", day)
    return {
        "event_date": day.isoformat(),
        "silver_arrivals_read": [],
        "silver_rows": 0,
        f"rows_{CUSTOMER_TABLE}": 0,
        f"rows_{MERCHANT_TABLE}": 0,
        "removed": True,
    }


def _stable_file_names(partition: Path) -> None:
    """Rewrite Spark's files of a staged gold partition so the same rows give the same bytes and names
    everywhere (run by `overwrite_partitions` before the partition is swapped in).

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


@lineage.emits("version_gold", _version_lineage)
def version_gold(settings: Settings, day: date) -> dict:
    """Version the date's gold partitions with DVC (both tables in one commit and one push); returns the
    dataset revision and its members."""
    from pipelines.versioning import record_revision, track_many

    tables = (CUSTOMER_TABLE, MERCHANT_TABLE)
    partitions = [
        (f"gold/{table}/{PARTITION_COLUMN}={day}", _gold_partition(table_path(settings.lake, table), day))
        for table in tables
    ]
    if not any(path.is_dir() for _, path in partitions):
        return {"dataset_rev": None, "members": {}, "skipped": f"no gold for event date {day}"}
    members = dict(zip(tables, track_many(settings, partitions), strict=True))
    rev = record_revision(settings, members)
    write_json(gold_revision_path(settings.home, day), {"event_date": day.isoformat(), "dataset_rev": rev})
    return {"dataset_rev": rev, "members": {k: v.md5 for k, v in members.items()}}


def _gold_partition(root: Path, day: date) -> Path:
    return root / f"{PARTITION_COLUMN}={day.isoformat()}"


@lineage.emits("validate_gold", _gold_validation_lineage)
def validate_gold(settings: Settings, day: date) -> list[dict]:
    spark = spark_session(settings)
    results = []
    for table in (CUSTOMER_TABLE, MERCHANT_TABLE):
        partition = _gold_partition(table_path(settings.lake, table), day)
        if not partition.is_dir() and (read_json(build_path(settings.lake, day)) or {}).get("removed"):
            continue  # removed by build_gold: no transaction has this event date any more
        df = spark.read.parquet(str(partition)).withColumn(PARTITION_COLUMN, F.lit(day))
        results.append(validate(df, gold_suite_name(table), settings.home, {}))
    # Kept for lineage: the model trained on this gold records which suites passed.
    write_json(validation_path(settings.lake, day), {"event_date": day.isoformat(), "results": results})
    return results
