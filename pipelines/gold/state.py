"""Daily totals kept beside silver, so a date's features never re-read their 30-day lookback row by row.

Per silver arrival date X, three small tables under $MLOPS_HOME/lake/state/features:

- customer_daily, merchant_daily: per entity and event date, the intermediate states its declared features
  merge from (transforms.daily_parts: today the customer's count, USD sum and sum of squares, abroad
  count and last event ms; the merchant's count and USD sum);
- merchant_chargebacks: the fraud chargebacks that arrived on X, with the merchant of their transaction
  (looked up once, in silver of the arrivals X-32 .. X, instead of on every date of the next 30).

Each arrival's totals are derived from its silver partitions and recorded with a signature of those files
(names, sizes, modification times) and, when chargebacks arrived with it, of the silver of every arrival
in their reach: when silver of X is rewritten (a rerun of its ingestion), or an arrival of X's reach is
delivered or rewritten after X (an out-of-order delivery or a re-delivery, which may hold the transaction a
chargeback refers to), the next feature build finds the signature changed and derives X's totals again. A
chargeback's merchant is looked up in its own reach whichever arrivals are derived together, so a date
built arrival by arrival equals one built from scratch. Missing or stale arrivals are all derived in one
Spark job, so the first build on an existing lake costs one pass over its history, and every later date
only its own arrival (and those whose chargebacks may refer to it, when it came out of order).
"""

from __future__ import annotations

import functools
import hashlib
import logging
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.gold import transforms
from pipelines.ingest.schemas import SILVER_LABELS, SILVER_TRANSACTIONS
from pipelines.lake import (
    Tables,
    clear_partitions,
    overwrite_partitions,
    read_arrow,
    read_json,
    read_partitions,
    write_json,
)

log = logging.getLogger(__name__)

# Each table's columns, besides arrival_date (the schema of an empty read).
SCHEMAS = {
    "customer_daily": transforms.daily_schema("customer"),
    "merchant_daily": transforms.daily_schema("merchant"),
    "merchant_chargebacks": "merchant_id string, label_date date, label_ms long",
}


# What the states hold: a declaration that needs another state changes it, and every arrival whose record
# was derived for another format is derived again (the backfill of a new feature's states).
def _format(schemas: dict[str, str]) -> str:
    return hashlib.sha256(repr(sorted(schemas.items())).encode()).hexdigest()[:16]


FORMAT = _format(SCHEMAS)
# The tables an arrival derived before its record kept the format holds (the states before they were
# generated from the declarations): such a record is current while the declarations need no other state,
# so an upgrade derives nothing again (which would also move gold's last bits: the days' totals are summed
# in another order after a derivation of all arrivals in one job).
_UNRECORDED_FORMAT = _format(
    {
        "customer_daily": "customer_id string, event_date date, n long, usd_sum double, usd_sumsq double, "
        "foreign_n double, last_ms long",
        "merchant_daily": "merchant_id string, event_date date, n long, usd_sum double",
        "merchant_chargebacks": "merchant_id string, label_date date, label_ms long",
    }
)
TABLES = tuple(SCHEMAS)
# Each table's rows in its files, in this order (every column but the totals).
ORDER = {
    "customer_daily": ("customer_id", "event_date"),
    "merchant_daily": ("merchant_id", "event_date"),
    "merchant_chargebacks": ("merchant_id", "label_date", "label_ms"),
}
CHARGEBACK_REACH_DAYS = 32  # chargebacks are reported up to 30 days after the day of their transaction


def state_root(lake: Path) -> Path:
    return lake / "state" / "features"


def _signature_path(lake: Path, arrival: date) -> Path:
    return state_root(lake) / "_sources" / f"arrival_date={arrival.isoformat()}.json"


def _signature(tables: Tables, arrival: date) -> str:
    digest = hashlib.sha256()
    for root in (tables.silver, tables.silver_labels):
        partition = Tables.partition(root, arrival)
        files = sorted(partition.iterdir()) if partition.is_dir() else []
        for path in (f for f in files if not f.name.startswith(("_", "."))):  # what Spark reads
            stat = path.stat()
            digest.update(f"{root.name}/{path.name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _inputs_signature(
    tables: Tables, arrival: date, with_silver: list[date], own: Callable[[date], str]
) -> str:
    """The signature of what an arrival's totals are derived from: its own silver and labels files, and,
    when chargebacks arrived with it, the silver files of every arrival in their reach."""
    if not Tables.partition(tables.silver_labels, arrival).is_dir():
        return own(arrival)
    first = arrival - timedelta(days=CHARGEBACK_REACH_DAYS)
    digest = hashlib.sha256(own(arrival).encode())
    for other in with_silver:
        if first <= other < arrival:
            digest.update(f"{other.isoformat()}:{own(other)}\n".encode())
    return digest.hexdigest()


def arrivals_with_silver(tables: Tables, first: date | None = None, last: date | None = None) -> list[date]:
    """Arrival dates with a silver partition, between `first` and `last` when given."""
    prefix = "arrival_date="
    found = (
        sorted(
            date.fromisoformat(p.name.removeprefix(prefix))
            for p in tables.silver.iterdir()
            if p.name.startswith(prefix) and p.is_dir()
        )
        if tables.silver.is_dir()
        else []
    )
    return [d for d in found if (first is None or d >= first) and (last is None or d <= last)]


def known_arrivals(lake: Path) -> dict[date, dict]:
    """The arrivals whose totals were derived, with their records as last derived."""
    folder = state_root(lake) / "_sources"
    records = (read_json(p) for p in sorted(folder.glob("arrival_date=*.json"))) if folder.is_dir() else ()
    return {date.fromisoformat(r["arrival_date"]): r for r in records if r}


def prune(lake: Path, keep: list[date]) -> list[date]:
    """Drop the totals of arrivals whose silver is gone (not in `keep`); return them."""
    gone = sorted(set(known_arrivals(lake)) - set(keep))
    for table in TABLES:
        target = state_root(lake) / table
        clear_partitions(target, tuple(Tables.partition(target, a) for a in gone))
    for arrival in gone:
        forget(lake, arrival)
    return gone


def dates_of(record: dict) -> set[date]:
    """The event dates an arrival holds rows of, and the dates its chargebacks were reported on."""
    return {date.fromisoformat(d) for d in (*record["event_dates"], *record.get("label_dates", ()))}


def ensure(spark: SparkSession, lake: Path, arrivals: list[date]) -> dict[date, dict]:
    """Derive the totals of every arrival in `arrivals` that has none or stale ones; return each arrival's
    record (signature, event dates and their counts)."""
    tables = Tables(lake)
    with_silver = arrivals_with_silver(tables)
    own = functools.cache(functools.partial(_signature, tables))
    records: dict[date, dict] = {}
    stale: dict[date, str] = {}
    for arrival in arrivals:
        record = read_json(_signature_path(lake, arrival))
        # before any read: a later rewrite is seen next time
        signature = _inputs_signature(tables, arrival, with_silver, own)
        if (
            record
            and record.get("signature") == signature
            and record.get("format", _UNRECORDED_FORMAT) == FORMAT
        ):
            records[arrival] = record
        else:
            stale[arrival] = signature
    if stale:
        records |= _derive(spark, lake, stale)
    return records


def forget(lake: Path, arrival: date) -> None:
    """Drop an arrival's signature: its totals are derived again by the next build that needs them."""
    _signature_path(lake, arrival).unlink(missing_ok=True)


def _derive(spark: SparkSession, lake: Path, signatures: dict[date, str]) -> dict[date, dict]:
    tables = Tables(lake)
    arrivals = sorted(signatures)
    silver = read_partitions(spark, tables.silver, arrivals, SILVER_TRANSACTIONS)
    assert silver is not None, "every arrival in `signatures` has a silver partition"
    evts = transforms.events(silver)
    root = state_root(lake)
    written = {
        "customer_daily": transforms.daily(evts, "customer"),
        "merchant_daily": transforms.daily(evts, "merchant"),
    }
    labels = read_partitions(spark, tables.silver_labels, arrivals, SILVER_LABELS)
    if labels is not None:
        first = min(arrivals) - timedelta(days=CHARGEBACK_REACH_DAYS)
        reach_silver = read_partitions(
            spark, tables.silver, arrivals_with_silver(tables, first, max(arrivals)), SILVER_TRANSACTIONS
        )
        assert reach_silver is not None, "the reach includes `arrivals`, which have silver partitions"
        merchants = reach_silver.select(
            "transaction_id", "merchant_id", F.col("arrival_date").alias("transaction_arrival")
        )
        written["merchant_chargebacks"] = transforms.attributed_chargebacks(
            labels, merchants, CHARGEBACK_REACH_DAYS
        )
    for table in TABLES:
        target = root / table
        now_empty = tuple(Tables.partition(target, a) for a in arrivals)
        if table in written:
            # One file per arrival, its rows in key order: a date's gold sums these totals in the order it
            # reads them, so an arrival derived alone or with others must give the same bytes.
            frame = written[table].repartition("arrival_date").sortWithinPartitions(*ORDER[table])
            overwrite_partitions(frame, target, ["arrival_date"], now_empty=now_empty)
        else:  # no chargebacks arrived on these dates
            clear_partitions(target, now_empty)
    records = {}
    for arrival in arrivals:
        # The counts come from the totals just written (small; read with Arrow, no Spark job).
        daily = read_arrow(Tables.partition(root / "merchant_daily", arrival), ["event_date", "n"])
        totals = daily.group_by("event_date").aggregate([("n", "sum")]) if daily is not None else None
        reported = read_arrow(Tables.partition(root / "merchant_chargebacks", arrival), ["label_date"])
        record = {
            "arrival_date": arrival.isoformat(),
            "signature": signatures[arrival],
            "format": FORMAT,
            "event_dates": {
                day.isoformat(): int(n)
                for day, n in sorted(
                    zip(totals["event_date"].to_pylist(), totals["n_sum"].to_pylist(), strict=True)
                )
            }
            if totals is not None
            else {},
            "label_dates": sorted({d.isoformat() for d in reported["label_date"].to_pylist()})
            if reported is not None
            else [],
        }
        write_json(_signature_path(lake, arrival), record)
        records[arrival] = record
    log.info(
        "feature state derived for %d arrival dates: %s .. %s", len(arrivals), min(arrivals), max(arrivals)
    )
    return records


def read_table(spark: SparkSession, lake: Path, table: str, arrivals: list[date]) -> DataFrame:
    """A state table over `arrivals` (empty, with its columns, when none of them has rows)."""
    frame = read_partitions(spark, state_root(lake) / table, arrivals, f"{SCHEMAS[table]}, arrival_date date")
    return frame if frame is not None else spark.createDataFrame([], SCHEMAS[table])
