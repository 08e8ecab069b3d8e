"""Landing files of one arrival date: which files belong to it, each checked as a whole, and their lines
numbered for the reconciliation. The lake's tables and writes are in pipelines/lake.py."""

from __future__ import annotations

import csv
import fnmatch
import gzip
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import IO

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from core.errors import ArrivalNotFoundError, PipelineError
from pipelines.contracts import REQUIRED_TRANSACTION_COLUMNS, TRANSACTION_COLUMNS

log = logging.getLogger(__name__)

DATA_SUFFIXES = {".csv": "csv", ".jsonl": "json", ".json": "json"}
GZIP_SUFFIX = ".gz"  # Spark (Hadoop's codec factory) decompresses by this suffix, lower case only
FEEDS = ("transactions", "labels")
# The producer's completion marker, written last (the ingest DAG waits for it; the same name as
# orchestration.tasks.COMPLETE_MARKER), and what the synthetic generator writes beside its data
# (pipelines/synthetic/landing.py): an arrival folder may always hold these, whatever is ignored.
COMPLETE_MARKER = "_SUCCESS"
CONTROL_FILES = frozenset({COMPLETE_MARKER, "_GENERATED_BY", "_manifest.json"})
DEFAULT_IGNORE_FILES = (".*", "_*")  # IngestSettings.ignore_files
# Spark reads a path as a glob and names a file's lines by its URL-encoded name: a data file named with a
# space, %, #, [ or { would fail to read or have its lines silently left out.
READABLE_NAME = re.compile(r"[\w.+-]+")


class LostArrivalError(PipelineError):
    """An arrival folder without data rows for a date whose rows the lake holds: its files were lost."""


def data_format(name: str) -> tuple[str | None, bool]:
    """The format of a landing file by its name, case-insensitively, and whether it is gzipped:
    `transactions-1.CSV` is csv, `transactions-1.jsonl.gz` is gzipped json; (None, ...) when not data."""
    lowered = name.lower()
    compressed = lowered.endswith(GZIP_SUFFIX)
    stem = lowered.removesuffix(GZIP_SUFFIX)
    return DATA_SUFFIXES.get(Path(stem).suffix), compressed


@dataclass(frozen=True)
class LandingFile:
    path: Path
    fmt: str
    compressed: bool = False

    @property
    def name(self) -> str:
        return self.path.name

    def open_text(self) -> IO[str]:
        if self.compressed:
            return gzip.open(self.path, "rt", encoding="utf-8", newline="")
        return self.path.open("r", encoding="utf-8", newline="")


@dataclass
class Arrival:
    day: date
    folder: Path
    files: list[LandingFile]
    headers: dict[str, list[str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    empty_files: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def find_arrival(
    landing: Path,
    day: date,
    stem: str = "transactions",
    columns=TRANSACTION_COLUMNS,
    ignore: Sequence[str] = DEFAULT_IGNORE_FILES,
) -> Arrival:
    """List the `stem-*` files (transactions or labels) of one arrival date and check each as a whole.

    Every other entry of the folder must be a data file of the other feed, a control file (`_SUCCESS`) or
    match an `ignore` glob; anything else (`notes.txt`, `transactions.csv`, a subfolder) is a problem: a
    re-delivery under a name ingestion does not read must fail the date, not make it look empty.
    """
    folder = landing / day.isoformat()
    if not folder.is_dir():
        raise ArrivalNotFoundError(
            f"no arrival for {day}: {folder} does not exist. Wait for the producer to deliver it, or land "
            f"synthetic data with `mlops generate --start {day} --days 1`."
        )
    files, ignored, problems = [], [], []
    for path in sorted(folder.iterdir()):
        name = path.name
        feed = next((f for f in FEEDS if name.startswith(f"{f}-")), None)
        fmt, compressed = data_format(name)
        if feed is not None and fmt is not None and path.is_file():
            if feed != stem:
                continue  # the other feed's data, checked by its own step
            if compressed and not name.endswith(GZIP_SUFFIX):
                problems.append(
                    f"{name}: gzipped files must end in lower-case {GZIP_SUFFIX} to be decompressed; "
                    f"rename it to {name[: -len(GZIP_SUFFIX)]}{GZIP_SUFFIX}"
                )
            elif not READABLE_NAME.fullmatch(name):
                problems.append(
                    f"{name}: a file name Spark cannot read by (a space or one of %#?*[]{{}}); rename it "
                    f"with letters, digits, '.', '_', '-' and '+' only (e.g. {stem}-00001.csv)"
                )
            else:
                files.append(LandingFile(path, fmt, compressed))
        elif feed == stem and path.is_file():
            # Named as the feed's data but in no format we read: refusing it loses nothing, while
            # ignoring it would make the date look empty and clear what an earlier run wrote.
            problems.append(
                f"{name}: a {stem} file in no format ingestion reads; deliver it as .csv, .jsonl or "
                f".json, gzipped or not (.csv.gz)"
            )
        elif feed is None and name in CONTROL_FILES and path.is_file():
            continue
        elif feed is None and any(fnmatch.fnmatchcase(name, pattern) for pattern in ignore):
            ignored.append(name)
        else:
            problems.append(_unexpected_entry(path, feed, ignore))
    arrival = Arrival(day=day, folder=folder, files=files, ignored=ignored, problems=problems)
    if ignored:
        log.info("arrival %s: ignoring %s (MLOPS_INGEST__IGNORE_FILES)", day, ", ".join(ignored))
    for landing_file in files:
        _check_file(arrival, landing_file, columns)
    return arrival


def _unexpected_entry(path: Path, feed: str | None, ignore: Sequence[str]) -> str:
    """Why an entry of an arrival folder that is no data file, control file or ignored one stops the date."""
    what = "a folder" if path.is_dir() else "a file"
    hint = ""
    if feed is None and path.name.lower().startswith(FEEDS):
        hint = f" (data files are named <feed>-<part>, e.g. {FEEDS[0]}-00000.csv: rename it if it is data)"
    elif feed is not None:
        hint = " (data files must be files directly in the arrival folder)"
    if feed is not None:  # named as data: never ignorable, it must be fixed
        return f"{path.name}: {what} named as {feed} data that ingestion cannot read{hint}"
    return (
        f"{path.name}: {what} that is neither a data file (transactions-*/labels-* ending in .csv, .jsonl "
        f"or .json, gzipped or not) nor the completion marker {COMPLETE_MARKER}{hint}. Move it out of the "
        f"arrival folder, or, if the producer always sends it, ignore it: "
        f"MLOPS_INGEST__IGNORE_FILES='{json.dumps([*ignore, path.name])}'"
    )


def refuse_to_clear(
    spark: SparkSession,
    folder: Path,
    feed: str,
    partitions: dict[str, Path],
    record_path: Path,
    empty_files: Sequence[str],
    allow: bool,
) -> dict[str, int]:
    """Before an arrival without data rows clears its date: the rows the lake holds of the date, by table.

    None held (a first delivery of a quiet day): nothing to lose. Some held, or a reconciliation record
    that counted rows in: the folder lost its files, so raise LostArrivalError, unless `allow` (the
    producer retracted the day), which returns what is about to be cleared.
    """
    held = {
        table: spark.read.parquet(str(partition)).count()
        for table, partition in partitions.items()
        if partition.is_dir() and any(partition.rglob("*.parquet"))
    }
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    if not any(held.values()) and not record.get("rows_in"):
        return {}
    rows = ", ".join(f"{table} {count} rows" for table, count in held.items()) or "no partition rows"
    if allow:
        log.warning(
            "arrival %s has no %s rows: clearing %s of the date (MLOPS_INGEST__ALLOW_EMPTY_OVERWRITE)",
            folder.name,
            feed,
            rows,
        )
        return held
    source = (
        f"ingested by run {record.get('run_id')} from {', '.join(record.get('files') or []) or 'no files'} "
        f"({record.get('rows_in', 0)} rows in; record {record_path})"
        if record
        else f"no reconciliation record at {record_path}"
    )
    found = f"only empty files: {', '.join(empty_files)}" if empty_files else f"no {feed}-* data files"
    raise LostArrivalError(
        f"arrival {folder.name}: {folder} has no {feed} data rows ({found}), but the lake holds {rows} of "
        f"this date, {source}. Nothing was cleared or written. If the files were lost or moved, restore "
        f"them to {folder} and rerun the date; if the producer really retracted the day, rerun it with "
        f"MLOPS_INGEST__ALLOW_EMPTY_OVERWRITE=true to clear the date."
    )


def _check_file(arrival: Arrival, landing_file: LandingFile, columns: tuple[str, ...]) -> None:
    path, name = landing_file.path, landing_file.name
    if path.stat().st_size == 0:
        arrival.empty_files.append(name)
        return
    try:
        with landing_file.open_text() as handle:
            first = handle.readline()
            has_rows = bool(handle.readline())
    except UnicodeDecodeError as exc:
        arrival.problems.append(
            f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-export as UTF-8"
        )
        return
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError; a truncated gzip ends in EOFError
        arrival.problems.append(f"{name}: not a readable gzip file ({exc}); have it resent")
        return
    first = first.removeprefix("\ufeff")  # a file of only a byte-order mark is empty too
    if not first:  # a gzipped empty file has bytes but no text
        arrival.empty_files.append(name)
        return
    if "\x00" in first:  # ASCII text in UTF-16 without a byte-order mark decodes as UTF-8 with NULs
        arrival.problems.append(f"{name}: NUL characters in its first line: UTF-16 text? re-export as UTF-8")
        return
    if landing_file.fmt == "json":
        return  # JSON columns are checked over the whole file by `json_key_problems`
    header = next(csv.reader([first.rstrip("\r\n")]))
    arrival.headers[name] = header
    for column in columns:
        if column not in header:
            kind = (
                "required"
                if column in REQUIRED_TRANSACTION_COLUMNS or columns != TRANSACTION_COLUMNS
                else "expected"
            )
            arrival.problems.append(f"{name}: missing {kind} column '{column}' (header: {','.join(header)})")
    for column in header:
        if column not in columns:
            arrival.problems.append(
                f"{name}: unexpected column '{column}'; the contract is {','.join(columns)}"
            )
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        arrival.problems.append(
            f"{name}: column(s) {', '.join(repeated)} appear more than once in the header"
        )
    if not has_rows:
        arrival.empty_files.append(name)


def json_key_problems(
    spark: SparkSession, files: list[LandingFile], columns: tuple[str, ...] = TRANSACTION_COLUMNS
) -> list[str]:
    """A JSON file lacks a column when no record in it has that key."""
    required = REQUIRED_TRANSACTION_COLUMNS if columns == TRANSACTION_COLUMNS else columns
    json_files = [f for f in files if f.fmt == "json" and f.path.stat().st_size > 0]
    if not json_files:
        return []
    from pyspark.sql.types import MapType, StringType

    keys = (
        spark.read.text([str(f.path) for f in json_files])
        .select(
            F.col("_metadata.file_name").alias("file"),
            F.explode(F.map_keys(F.from_json("value", MapType(StringType(), StringType())))).alias("key"),
        )
        .distinct()
        .collect()
    )
    present: dict[str, set[str]] = {f.name: set() for f in json_files}
    for row in keys:
        present[row.file].add(row.key)
    problems = []
    for name, seen in present.items():
        if not seen:
            problems.append(
                f"{name}: no line is a JSON object with keys; .json and .jsonl files must be JSON Lines, "
                f"one object per line (not a JSON array, not pretty-printed)"
            )
            continue
        problems += [
            f"{name}: missing {'required' if c in required else 'expected'} column '{c}' "
            f"(no record in the file has it)"
            for c in columns
            if c not in seen
        ]
    return problems


def read_lines(spark: SparkSession, files: list[LandingFile]) -> DataFrame:
    """Lines of `files` with `source_file` (name) and 1-based `line_number`, header lines included.

    Spark's text source does not number lines, and a large file is split across tasks. Within one split
    the rows keep file order and get consecutive monotonically increasing ids, so a line's number is its
    offset in its split plus the lines of the file's earlier splits.
    """
    lines = spark.read.text([str(f.path) for f in files]).select(
        "value",
        F.col("_metadata.file_name").alias("source_file"),
        F.col("_metadata.file_block_start").alias("_block"),
        F.monotonically_increasing_id().alias("_id"),
    )
    blocks = lines.groupBy("source_file", "_block").agg(
        F.min("_id").alias("_first"), F.count("*").alias("_n")
    )
    earlier = Window.partitionBy("source_file").orderBy("_block").rowsBetween(Window.unboundedPreceding, -1)
    blocks = blocks.withColumn("_before", F.coalesce(F.sum("_n").over(earlier), F.lit(0)))
    return lines.join(F.broadcast(blocks), ["source_file", "_block"]).select(
        "value",
        "source_file",
        (F.col("_id") - F.col("_first") + F.col("_before") + 1).alias("line_number"),
    )
