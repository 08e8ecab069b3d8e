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

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType

from core.errors import ArrivalNotFoundError, PipelineError
from pipelines.contracts import REQUIRED_TRANSACTION_COLUMNS, TRANSACTION_COLUMNS
from pipelines.lake import parquet_rows
from pipelines.spark import adaptive_execution_off

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
# Where `read_lines` puts a line before it has a number: the first byte of its split, its ordinal in it.
BLOCK, ORDINAL = "_block", "_ordinal"


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
        table: parquet_rows(partition)
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
    files: list[LandingFile], keys: dict[str, set[str]], columns: tuple[str, ...] = TRANSACTION_COLUMNS
) -> list[str]:
    """A JSON file lacks a column when no record in it has that key; `keys` holds the keys of the records of
    each file, gathered in the pass that parses them (`read_splits`)."""
    required = REQUIRED_TRANSACTION_COLUMNS if columns == TRANSACTION_COLUMNS else columns
    problems = []
    for landing_file in files:
        if landing_file.fmt != "json":
            continue
        seen = keys.get(landing_file.name, set())
        if not seen:
            problems.append(
                f"{landing_file.name}: no line is a JSON object with keys; .json and .jsonl files must be "
                f"JSON Lines, one object per line (not a JSON array, not pretty-printed)"
            )
            continue
        problems += [
            f"{landing_file.name}: missing {'required' if c in required else 'expected'} column '{c}' "
            f"(no record in the file has it)"
            for c in columns
            if c not in seen
        ]
    return problems


def read_lines(spark: SparkSession, files: list[LandingFile]) -> DataFrame:
    """Every line of `files`, read once: `value`, `source_file`, and where the line is as the split that
    read it knows it: `_block` (the first byte of the split in its file) and `_ordinal` (one more than the
    line before it in the same split). `line_number` is null: a large file is read in several splits at
    once, and a line's number needs the lines of the earlier splits, known only once every split was read;
    `number_lines` adds it then, from the counts that `read_splits` takes. A byte-order mark opening a file
    is not part of its first line (Hadoop's line reader skips it); anywhere else it stays in the line.
    """
    return spark.read.text([str(f.path) for f in files]).select(
        "value",
        F.col("_metadata.file_name").alias("source_file"),
        F.lit(None).cast(LongType()).alias("line_number"),
        F.col("_metadata.file_block_start").alias(BLOCK),
        F.monotonically_increasing_id().alias(ORDINAL),
    )


@dataclass(frozen=True)
class Split:
    """The lines of one file that one task read: from `first` (its first line's ordinal) on, `lines` of
    them, and the line number of the first (1 + the lines of the file's earlier splits)."""

    source_file: str
    block: int
    first: int
    lines: int
    first_line_number: int = 0


def read_splits(rows: DataFrame, key_mask: str | None = None) -> tuple[list[Split], dict[str, int]]:
    """Count the rows of each split (one small aggregation over `rows`, which carry `_block` and `_ordinal`
    from `read_lines`): the splits with their first line numbers, and per file the bits of `key_mask` set
    in any of its rows (the JSON keys seen, see `transforms.json_key_mask`)."""
    mask = F.bit_or(key_mask) if key_mask else F.lit(0)
    with adaptive_execution_off(rows.sparkSession):
        counted = (
            rows.groupBy("source_file", BLOCK)
            .agg(F.min(ORDINAL).alias("first"), F.count("*").alias("lines"), mask.alias("mask"))
            .collect()
        )
    splits: list[Split] = []
    masks: dict[str, int] = {}
    before: dict[str, int] = {}
    for row in sorted(counted, key=lambda r: (r["source_file"], r[BLOCK])):
        name = row["source_file"]
        splits.append(Split(name, row[BLOCK], row["first"], row["lines"], before.get(name, 0) + 1))
        before[name] = before.get(name, 0) + row["lines"]
        masks[name] = masks.get(name, 0) | (row["mask"] or 0)
    return splits, masks


def number_lines(rows: DataFrame, splits: list[Split]) -> DataFrame:
    """`rows` (from `read_lines`, through any row-wise transform) with their 1-based `line_number` in their
    file, header lines included; `_block` and `_ordinal` dropped. Within a split the rows keep file order
    with consecutive ordinals, so a line's number is its distance from the split's first line plus the
    first line's number."""
    spark = rows.sparkSession
    offsets = spark.createDataFrame(
        [(s.source_file, s.block, s.first_line_number - s.first) for s in splits],
        f"source_file string, {BLOCK} long, _offset long",
    )
    numbered = rows.drop("line_number").join(F.broadcast(offsets), ["source_file", BLOCK])
    columns = [c for c in rows.columns if c not in (BLOCK, ORDINAL)]
    line = (F.col(ORDINAL) + F.col("_offset")).alias("line_number")
    return numbered.select(*(line if c == "line_number" else F.col(c) for c in columns))
