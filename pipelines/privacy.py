"""A person's raw rows erased on request, and the raw layers kept only as long as the settings allow.

`erase_customer` removes every raw row of one customer from the landing zone (each transactions file of every
arrival folder, CSV or JSON lines, gzipped or not) and from the quarantine (both feeds, both stages), and the
chargebacks of that customer's transactions from the labels files and their quarantine. A line is the
customer's when its `customer_id` field is the id; a line that does not parse (it was quarantined for that)
is the customer's when it holds the id as a whole token, so a broken line is never left behind for being
broken. Each file is rewritten aside and renamed over the old one, under the table's lock for the lake's
files; a file with none of the customer's rows is not touched. The report counts what was removed, file by
file.

`enforce_retention` deletes landing folders and quarantine partitions older than their retention
(`RetentionSettings`), counted back from the newest arrival the lake has ingested, and the scoring log's
dates older than `serving.log_retention_days` before its newest (what the service does as it writes, done
here too for a service that is idle or down): the lake's own dates,
never a caller's or this machine's clock, so a replayed or late feed is not emptied by the calendar. A landing
folder the lake has not ingested is kept, whatever its age: deleting it would lose the only copy.

Past landing the customer is their pseudonym (core/pseudonym.py), still personal data: their rows leave bronze
and silver (and their chargebacks silver's labels), partition by partition with no older version kept, and
every file of the scoring service's log. The online store (features/materialize.py `erase_customers`), gold,
its DVC revisions and the training rows are the layers above: `mlops erase` (mlops/chain.py `erase`) removes
their online entities, then rebuilds gold from silver (the features backfill finds the arrivals whose silver
changed), and names what still holds them: the earlier DVC revisions and the models trained on them, kept
(a version's training set is its record) until their retention (pipelines/retention.py,
training/retention.py), which `enforce_retention` here runs first for the raw layers.
"""

from __future__ import annotations

import csv
import gzip
import json
import logging
import os
import re
import shutil
from collections.abc import Collection, Iterable, Iterator
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from core import pseudonym
from core.errors import PipelineError
from core.pseudonym import customer_id
from core.retention import dated_folders, expire_dated_folders
from pipelines.ingest.landing import data_format
from pipelines.lake import Tables, clear_partitions, clear_replaced, rewrite_partitions, table_lock

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

PARTITION_PREFIX = "arrival_date="
# What the report counts rows removed in: file by file, or partition by partition for the lake.
ERASED_FROM = ("landing", "quarantine", "lake", "scoring_log")
# Rebuilt from what erasure left, by `mlops erase` (the features backfill), not by this module: gold, its DVC
# revisions and the training rows. Not reached at all yet:
NOT_REACHED = (
    "the earlier DVC revisions of gold and of the training sets (the DVC cache and remote) and the models "
    "trained on them: kept, each named under held_by",
    "MLflow artifacts (models, plots, model cards: no rows of a person), until their retention",
)


def pseudonym_of(settings: Settings, customer: str) -> str | None:
    """The customer's pseudonym in the stores past landing, or None without the key (said in the log)."""
    try:
        return pseudonym.for_settings(settings).customer(customer)
    except pseudonym.PseudonymKeyError as exc:
        log.warning("erase: no pseudonym to report for the stores past landing: %s", exc)
        return None


class ErasureError(PipelineError):
    """Files that could not be rewritten; the others were, and the report says which is which."""


def _token(value: str) -> re.Pattern[bytes]:
    """`value` as a whole token: not inside a longer id (ids are letters, digits, `_` and `-`)."""
    return re.compile(rb"(?<![\w-])" + re.escape(value.encode()) + rb"(?![\w-])")


def _parsed(raw: bytes, fmt: str | None, header: list[str] | None) -> dict | None:
    """One raw line as a record: a CSV line with as many fields as the header, or a JSON object; None when
    it does not parse (such a line is judged by the token)."""
    try:
        if fmt == "csv":
            fields = next(csv.reader([raw.decode("utf-8").rstrip("\r\n")]), [])
            return dict(zip(header, fields, strict=True)) if header and len(fields) == len(header) else None
        record = json.loads(raw)
    except (UnicodeDecodeError, csv.Error, json.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def _lines(path: Path, compressed: bool) -> Iterator[bytes]:
    with gzip.open(path, "rb") if compressed else path.open("rb") as handle:
        yield from handle


def _rewrite_text(path: Path, compressed: bool, kept: Iterable[bytes]) -> None:
    """`kept` written aside (a hidden name: ingestion ignores it) and renamed over `path`."""
    staged = path.with_name(f".erasing-{path.name}")
    try:
        with staged.open("wb") as raw:
            if compressed:
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed:
                    packed.writelines(kept)
            else:
                raw.writelines(kept)
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def _erase_in_file(path: Path, field: str, values: set[str], collect: str | None) -> tuple[int, set[str]]:
    """Remove the lines of `path` whose `field` is one of `values`; (lines removed, the `collect` field's
    values of the removed lines that parsed). Two streaming passes, so a file of any size fits: the first
    finds the lines, the second (only when there are some) writes the others."""
    fmt, compressed = data_format(path.name)
    header = None
    if fmt == "csv":
        first = next(_lines(path, compressed), b"")
        header = next(csv.reader([first.decode("utf-8", "replace").rstrip("\r\n")]), [])
    tokens = [_token(v) for v in sorted(values)]

    def judged() -> Iterator[tuple[bytes, dict | None, bool]]:
        for number, line in enumerate(_lines(path, compressed)):
            if (header is not None and number == 0) or not line.strip():
                yield line, None, False
                continue
            record = _parsed(line, fmt, header)
            value = record.get(field) if record else None
            theirs = value in values if isinstance(value, str) else any(t.search(line) for t in tokens)
            yield line, record, theirs

    removed, collected = 0, set[str]()
    for _, record, theirs in judged():
        if theirs:
            removed += 1
            if collect and record and isinstance(value := record.get(collect), str) and value:
                collected.add(value)
    if removed:
        _rewrite_text(path, compressed, (line for line, _, theirs in judged() if not theirs))
    return removed, collected


def _landing_files(settings: Settings, feed: str) -> list[Path]:
    """The data files of `feed` in every arrival folder (what ingestion would read)."""
    return [
        f
        for _, folder in sorted(dated_folders(settings.landing, "").items())
        for f in sorted(folder.iterdir())
        if f.is_file() and f.name.startswith(f"{feed}-") and data_format(f.name)[0]
    ]


def _silver_transaction_ids(tables: Tables, ids: set[str]) -> set[str]:
    """The ids of the customer's transactions in silver, which knows them by pseudonym (their chargebacks
    are theirs too)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if not tables.silver.is_dir() or not ids:
        return set()
    dataset = ds.dataset(tables.silver, format="parquet", partitioning="hive", exclude_invalid_files=True)
    theirs = pc.field("customer_id").isin(pa.array(sorted(ids)))
    found = dataset.to_table(columns=["transaction_id"], filter=theirs)
    return set(found.column("transaction_id").to_pylist())


def _erase_in_quarantine(root: Path, column: str | None, values: set[str]) -> dict[str, int]:
    """Rows of the quarantine table at `root` whose raw record is one of `values`' (by `column` when given,
    else by the raw record's own field or token); {file: rows removed}."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    removed: dict[str, int] = {}
    if not root.is_dir() or not values:
        return removed
    tokens = [_token(v) for v in sorted(values)]
    with table_lock(root):
        clear_replaced(root)  # the older versions of its partitions hold the rows too
        for path in sorted(root.glob(f"{PARTITION_PREFIX}*/stage=*/*.parquet")):
            table = pq.read_table(path)
            raw = table.column("raw_record").to_pylist()
            theirs = [any(t.search(r.encode()) for t in tokens) if r is not None else False for r in raw]
            if column is not None:
                by_column = pc.is_in(table.column(column), value_set=pa.array(sorted(values)))
                theirs = [a or bool(b) for a, b in zip(theirs, by_column.to_pylist(), strict=True)]
            count = sum(theirs)
            if not count:
                continue
            kept = table.filter(pa.array([not t for t in theirs]))
            staged = path.with_name(f".erasing-{path.name}")
            pq.write_table(kept, staged, compression="zstd")
            os.replace(staged, path)
            path.with_name(f".{path.name}.crc").unlink(missing_ok=True)  # Spark's checksum of the old bytes
            removed[str(path.relative_to(root.parent.parent))] = count
    return removed


def erase_customer(settings: Settings, customer: str) -> dict:
    """Remove the customer's raw rows from landing and quarantine, and their chargebacks; the report."""
    customer = customer_id(customer)
    tables = Tables(settings.lake)
    report: dict = {
        "landing": {},
        "quarantine": {},
        "failed": {},
        "not_reached": list(NOT_REACHED),
        "pseudonym": pseudonym_of(settings, customer),
    }
    transactions: set[str] = set()
    for path in _landing_files(settings, "transactions"):
        try:
            count, ids = _erase_in_file(path, "customer_id", {customer}, collect="transaction_id")
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            report["failed"][str(path.relative_to(settings.landing))] = str(exc)
            continue
        transactions |= ids
        if count:
            report["landing"][str(path.relative_to(settings.landing))] = count
    # Past landing the customer is their pseudonym: silver's rows, the silver-stage quarantine's records.
    known_as = {customer, *filter(None, [report["pseudonym"]])}
    transactions |= _silver_transaction_ids(tables, known_as)
    for path in _landing_files(settings, "labels") if transactions else []:
        try:
            count, _ = _erase_in_file(path, "transaction_id", transactions, collect=None)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            report["failed"][str(path.relative_to(settings.landing))] = str(exc)
            continue
        if count:
            report["landing"][str(path.relative_to(settings.landing))] = count
    report["quarantine"] |= _erase_in_quarantine(tables.quarantine, None, known_as)
    report["quarantine"] |= _erase_in_quarantine(tables.quarantine_labels, "transaction_id", transactions)
    report["lake"] = _erase_in_lake(tables, known_as - {customer}, transactions)
    report["scoring_log"] = _erase_in_scoring_log(settings.scoring_log_dir, known_as - {customer})
    report["rows_removed"] = sum(sum(report[where].values()) for where in ERASED_FROM)
    report["chargebacks_matched_by"] = len(transactions)
    log.info("erasure: %d rows removed (%d files)", report["rows_removed"], len(report["landing"]))
    if report["failed"]:
        names = ", ".join(sorted(report["failed"]))
        raise ErasureError(
            f"could not erase from {names}: {report['failed']}; the other files were erased "
            f"({report['rows_removed']} rows). Fix or remove those files and run `mlops erase` again."
        )
    return report


def _erase_in_lake(tables: Tables, pseudonyms: set[str], transactions: set[str]) -> dict[str, int]:
    """The customers' rows of bronze and silver (by pseudonym) and their transactions' chargebacks in silver's
    labels, removed partition by partition under each table's lock, with no older version of a partition
    kept (`rewrite_partitions`, retention 0); {partition: rows removed}. Gold, derived from silver, is
    rebuilt from what is left by the features backfill, which finds the arrivals whose silver changed."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    removed: dict[str, int] = {}
    for root, column, values in (
        (tables.bronze, "customer_id", pseudonyms),
        (tables.silver, "customer_id", pseudonyms),
        (tables.silver_labels, "transaction_id", transactions),
    ):
        if not values or not root.is_dir():
            continue
        wanted = pa.array(sorted(values))

        def without(partition: Path, files: list[Path], column: str = column, wanted: pa.Array = wanted):
            found = [pq.read_table(f, columns=[column]).column(column) for f in files]
            if not any(pc.any(pc.is_in(part, value_set=wanted)).as_py() for part in found):
                return None
            table = pa.concat_tables([pq.read_table(f) for f in files])
            theirs = pc.is_in(table.column(column), value_set=wanted)
            removed[str(partition.relative_to(tables.lake))] = pc.sum(theirs).as_py()
            return table.filter(pc.invert(theirs))

        rewrite_partitions(root, without, retain_s=0)
    return removed


def _erase_in_scoring_log(root: Path, pseudonyms: set[str]) -> dict[str, int]:
    """The scoring service's rows of these customers (it logs pseudonyms: serving/scoring_log.py), removed
    from every file of the log, each rewritten aside and renamed over the old; {file: rows removed}. The
    service only ever adds new files, so a running one loses nothing to the rewrite."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    removed: dict[str, int] = {}
    if not root.is_dir() or not pseudonyms:
        return removed
    wanted = pa.array(sorted(pseudonyms))
    for path in sorted(root.glob("date=*/part-*.parquet")):
        customers = pq.read_table(path, columns=["customer_id"]).column("customer_id")
        theirs = pc.is_in(customers, value_set=wanted)
        count = pc.sum(theirs).as_py() or 0
        if not count:
            continue
        table = pq.read_table(path)
        staged = path.with_name(f".erasing-{path.name}")
        try:
            pq.write_table(table.filter(pc.invert(theirs)), staged)
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)
        removed[str(path.relative_to(root.parent))] = count
    return removed


def _ingested(tables: Tables) -> list[date]:
    folder = tables.reconciliation(date(2000, 1, 1)).parent
    return sorted(
        date.fromisoformat(p.stem.removeprefix(PARTITION_PREFIX))
        for p in (folder.glob(f"{PARTITION_PREFIX}*.json") if folder.is_dir() else ())
    )


def newest_ingested(settings: Settings) -> date | None:
    """The newest arrival the lake has ingested, which every retention counts back from; None before any."""
    ingested = _ingested(Tables(settings.lake))
    return ingested[-1] if ingested else None


def enforce_retention(settings: Settings, keep_revisions: Collection[str] = (), why_kept: str = "") -> dict:
    """Delete landing folders and quarantine partitions past their retention, then the lake's and the
    training sets' dated entries and the DVC revisions past theirs but `keep_revisions`
    (pipelines/retention.py), each counted back from the newest arrival the lake has ingested; what was
    deleted and what was kept though old."""
    from pipelines.retention import MAY_SERVE, check_retention, expire_lake, expire_revisions

    check_retention(settings)  # before anything is deleted
    tables = Tables(settings.lake)
    ingested = _ingested(tables)
    report: dict = {
        "newest_ingested": None,
        "landing_removed": [],
        "quarantine_removed": [],
        "lake_removed": [],
        "revisions_removed": [],
        "objects_removed": {},
        "kept": {},
    }
    # The scoring log by its own dates (the service's clock), as the service expires it while it writes.
    report["scoring_log_removed"] = expire_dated_folders(
        settings.scoring_log_dir, "date=", settings.serving.log_retention_days
    )
    if not ingested:
        return report
    newest = ingested[-1]
    report["newest_ingested"] = newest.isoformat()
    keep_landing = newest - timedelta(days=settings.retention.landing_days)
    for day, folder in sorted(dated_folders(settings.landing, "").items()):
        if day >= keep_landing:
            continue
        if day not in ingested:
            report["kept"][f"landing/{folder.name}"] = "not ingested: the lake has no copy of it yet"
            continue
        shutil.rmtree(folder)
        report["landing_removed"].append(folder.name)
    keep_quarantine = newest - timedelta(days=settings.retention.quarantine_days)
    for root in (tables.quarantine, tables.quarantine_labels):
        partitions = dated_folders(root, PARTITION_PREFIX)
        old = tuple(partitions[day] for day in sorted(partitions) if day < keep_quarantine)
        if old:
            clear_partitions(root, old, retain_s=0)
            report["quarantine_removed"] += [str(p.relative_to(settings.lake)) for p in old]
    report["lake_removed"] = expire_lake(settings, newest)
    revisions = expire_revisions(settings, newest, set(keep_revisions), why_kept or MAY_SERVE)
    report["revisions_removed"] = revisions["revisions_removed"]
    report["objects_removed"] = revisions["objects_removed"]
    report["kept"].update({f"revision {k}": why for k, why in revisions["kept"].items()})
    log.info("retention: %s", report)
    return report
