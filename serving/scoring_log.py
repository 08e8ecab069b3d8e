"""The scoring log: every scored transaction, appended off the response path, as Parquet by the date it was
scored.

Layout: `$MLOPS_HOME/scoring_log/date=YYYY-MM-DD/part-<first scored time>-<uuid>.parquet`, one folder per
date of `scored_at`, the service's own clock (serving/clock.py: the machine's, or the replayed day's), never
the caller's event time, so a caller cannot scatter rows over dates it chooses. Files are written whole by a
background thread (a temporary name, then an atomic rename: a reader never sees half a file); temporary
files a crash left are removed when the log opens. Readers ask for event dates (`read_scoring_log`): an event
time lies within the service's window around its scoring time (`serving.max_lateness_s` at most 7 days
before it, `serving.max_future_skew_s` at most a day after), so the dates that can hold an event date's rows
are known.

Bounded: the rows waiting for the disk are capped (`serving.log_max_pending_rows`); past the cap new rows
are dropped and counted (`dropped`, in /status) and `problem` says so, which the readiness endpoint turns
red until the writer catches up. Partitions scored more than `serving.log_retention_days` before the newest
one written are deleted.

A row holds what the decision was made from and with: the transaction's identity and time, every model
input as the service computed it (`model_contract.inputs.NUMERIC_FEATURES` as float64, null where missing, and
the raw categorical values), the champion's score and decision with its version, the shadow challenger's
score and version (null where none), which entities the online store did not know, the server-side
latency, and the caller whose token sent it (the audit of every scoring call).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from core import lineage
from core.retention import expire_dated_folders
from model_contract.inputs import CATEGORICAL_FEATURES, NUMERIC_FEATURES

if TYPE_CHECKING:
    import pyarrow as pa

    from core.settings import Settings

log = logging.getLogger(__name__)

PARTITION = "date"
ID_COLUMNS = ("transaction_id", "customer_id", "merchant_id")
RAW_COLUMNS = ("amount", "currency", *CATEGORICAL_FEATURES)  # the request's values the features came from
# Rows are turned into Arrow this many at a time as they come, not all at the flush (see ScoringLog._convert).
CONVERT_ROWS = 64
# Scored batches (Columns) are turned into Arrow together, at least this many rows at a time: a column's call
# costs the same for one row as for hundreds, and 256 rows hold the GIL well under a millisecond.
CONVERT_COLUMN_ROWS = 256
POLL_S = 0.05  # how often the writer takes the rows appended since it last looked


@functools.cache
def schema() -> pa.Schema:
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    return pa.schema(
        [
            *(pa.field(name, pa.string(), nullable=False) for name in ID_COLUMNS),
            pa.field("event_timestamp", ts, nullable=False),
            pa.field("scored_at", ts, nullable=False),
            pa.field("amount", pa.float64()),
            *(pa.field(name, pa.string()) for name in ("currency", *CATEGORICAL_FEATURES)),
            *(pa.field(name, pa.float64()) for name in NUMERIC_FEATURES),
            pa.field("model_name", pa.string(), nullable=False),
            pa.field("model_version", pa.string(), nullable=False),
            pa.field("score", pa.float64(), nullable=False),
            pa.field("decision", pa.string(), nullable=False),
            pa.field("threshold", pa.float64(), nullable=False),
            pa.field("shadow_version", pa.string()),
            pa.field("shadow_score", pa.float64()),
            # the shadow's own operating point and what it would have decided (null in logs from before)
            pa.field("shadow_threshold", pa.float64()),
            pa.field("shadow_decision", pa.string()),
            pa.field("missing_entities", pa.string()),  # comma-separated join keys not in the store
            # the decision's reasons, `input:+effect;...` (serving/reasons.py); null: not explained
            pa.field("reasons", pa.string()),
            pa.field("latency_ms", pa.float64(), nullable=False),
            pa.field("caller", pa.string()),  # the token's caller (serving/auth.py); null without auth
        ]
    )


@functools.cache
def column_names() -> frozenset[str]:
    return frozenset(schema().names)


# Columns of few distinct values, dictionary-encoded in the files. The ids, times and numbers are not: a
# dictionary of values that rarely repeat doubled the write's CPU and made the files larger
# (docs/benchmarks.md, "The scoring log's cost").
DICTIONARY_COLUMNS = (
    "currency", *CATEGORICAL_FEATURES, "model_name", "model_version", "decision", "threshold",
    "shadow_version", "shadow_threshold", "shadow_decision", "missing_entities", "reasons", "caller",
)  # fmt: skip
# Float columns where NaN means "missing" (null in the log): the model inputs. Elsewhere (a score) NaN is a
# value.
NAN_IS_NULL = frozenset(NUMERIC_FEATURES)


@dataclass(frozen=True)
class Columns:
    """One scored batch's rows as columns, as the scorer holds them: each name of schema() maps to a list or
    a 1-D numpy array of `rows` values (in a model input's array NaN is null). Batches turned into Arrow a
    column at a time, hundreds of rows at once, cost a third of reading rows of dicts, and the scorer builds
    no dict a row for them (docs/benchmarks.md, "The scoring log's cost")."""

    day: date  # the scoring date (the service's clock): the partition its rows go to
    rows: int
    data: dict[str, Any]

    def __post_init__(self) -> None:
        names = column_names()
        if self.data.keys() != names:
            raise ValueError(
                f"scoring log columns differ from the schema: missing {sorted(names - set(self.data))}, "
                f"unknown {sorted(set(self.data) - names)}"
            )

    def head(self, count: int) -> Columns:
        return Columns(self.day, count, {name: values[:count] for name, values in self.data.items()})

    def as_rows(self) -> list[dict[str, Any]]:
        """The same rows as dicts of Python values (a missing model input as None)."""

        def plain(name: str, column: Any) -> list:
            if not isinstance(column, np.ndarray):
                return list(column)
            values = column.tolist()
            return [None if v != v else v for v in values] if name in NAN_IS_NULL else values

        names = list(self.data)
        values = [plain(name, column) for name, column in self.data.items()]
        return [dict(zip(names, row, strict=True)) for row in zip(*values, strict=True)]


def columns_table(batches: list[Columns]) -> pa.Table:
    """Batches of one scoring date as one Arrow table: a call per column, not one per value."""
    import pyarrow as pa

    arrays = []
    for field in schema():
        parts = [batch.data[field.name] for batch in batches]
        if all(isinstance(part, np.ndarray) for part in parts):
            values = np.concatenate(parts) if len(parts) > 1 else parts[0]
            arrays.append(pa.array(values, type=field.type, from_pandas=field.name in NAN_IS_NULL))
        else:
            listed = (part.tolist() if isinstance(part, np.ndarray) else part for part in parts)
            arrays.append(pa.array(list(chain.from_iterable(listed)), type=field.type))
    return pa.Table.from_arrays(arrays, schema=schema())


def partition_dir(root: Path, day: date) -> Path:
    return root / f"{PARTITION}={day.isoformat()}"


# How far a scoring date may lie from the event dates of its rows (the service's window, core.settings
# ServingSettings: lateness at most 7 days, skew at most one).
SCORED_BEFORE_EVENT_DAYS = 1
SCORED_AFTER_EVENT_DAYS = 8


def read_scoring_log(
    root: Path, first: date, last: date, columns: list[str] | None = None, by_event_time: bool = True
) -> pa.Table:
    """The rows of event dates first .. last (an empty table with the schema where there are none), read
    from the scoring dates that can hold them. `by_event_time=False`: every row of those scoring dates,
    whatever event time its caller gave (a reader that dates rows by the feed's record, not the caller's)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    low = (first - timedelta(days=SCORED_BEFORE_EVENT_DAYS)).isoformat()
    high = (last + timedelta(days=SCORED_AFTER_EVENT_DAYS)).isoformat()
    days = sorted(
        p
        for p in root.glob(f"{PARTITION}=*")
        if p.is_dir() and low <= p.name.removeprefix(f"{PARTITION}=") <= high
    )
    files = [f for d in days for f in sorted(d.glob("*.parquet"))]
    target = schema() if columns is None else pa.schema([schema().field(c) for c in columns])
    if not files:
        return target.empty_table()
    start = datetime.combine(first, datetime.min.time(), tzinfo=UTC)
    end = datetime.combine(last + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    wanted = sorted({*target.names, "event_timestamp"})
    tables = []
    for f in files:
        table = pq.read_table(f, columns=wanted, schema=schema())
        if not by_event_time:
            tables.append(table.select(target.names))
            continue
        stamp = table["event_timestamp"]
        keep = pc.and_(
            pc.greater_equal(stamp, pa.scalar(start, stamp.type)), pc.less(stamp, pa.scalar(end, stamp.type))
        )
        tables.append(table.filter(keep).select(target.names))
    return pa.concat_tables(tables)


class DayLineage:
    """Announces each (scoring date, model version) the log writes, once per process: an OpenLineage run
    `score` that read the model version and wrote the date's folder (core/lineage.py). It remembers at most
    MAX_PAIRS pairs, then forgets them all at once: an event sent twice is harmless, a set that grows with
    every date and version is not."""

    MAX_PAIRS = 4096

    def __init__(self, settings: Settings) -> None:
        from model_contract.onnx import MODEL_NAME

        self.settings = settings
        self.model = MODEL_NAME
        self._seen: set[tuple[date, str]] = set()

    def __call__(self, root: Path, day: date, versions: set[str]) -> None:
        new = sorted(v for v in versions if (day, v) not in self._seen)
        if not new:
            return
        if len(self._seen) + len(new) > self.MAX_PAIRS:
            self._seen.clear()
        lineage.emit_once(
            self.settings,
            "score",
            lineage.Datasets(
                [lineage.model_version(self.settings, self.model, v) for v in new],
                [lineage.path(partition_dir(root, day))],
                {"date": day.isoformat()},
            ),
        )
        self._seen.update((day, v) for v in new)


class ScoringLog:
    """Takes rows (dicts of the schema's columns) from the request path without blocking on disk: rows go
    to an in-memory queue, at most `max_pending_rows` of them waiting at once (queued or kept after a failed
    write; past that they are dropped and counted); a daemon thread writes what queued every
    `flush_interval_s`, or as soon as `flush_rows` are waiting, one file per scoring date. `close()`
    writes what is left.

    A write that fails is logged with the folder and kept for the next flush while under the cap; `errors`
    counts failures, `written` the rows on disk, `dropped` the rows never written."""

    def __init__(
        self,
        root: Path,
        flush_rows: int = 5000,
        flush_interval_s: float = 5.0,
        max_pending_rows: int = 200_000,
        retention_days: int | None = None,
        on_written: Callable[[Path, date, set[str]], None] | None = None,
    ) -> None:
        self.root = root
        self.on_written = on_written  # told the model versions of each date's rows once they are on disk
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.max_pending_rows = max_pending_rows
        self.retention_days = retention_days
        self.written = 0
        self.errors = 0
        self.dropped = 0
        self.removed_partitions = 0
        self._held = 0  # rows appended and not yet on disk (queued or pending)
        self._held_lock = threading.Lock()
        self._newest: date | None = None
        # Rows come through a deque that wakes nobody: a queue's put woke the writer for every scored
        # batch, a thread hand-off per request (docs/benchmarks.md, "Scoring service"); the writer looks
        # every POLL_S instead. The queue carries only a flush's marker, a nudge, or None to stop.
        self._incoming: deque[list[dict[str, Any]] | Columns] = deque()
        self._queue: queue.Queue[threading.Event | None] = queue.Queue()
        self._pending: list[dict[str, Any]] = []  # rows taken from the deque, not yet in Arrow
        self._pending_columns: list[Columns] = []  # scored batches taken from the deque, not yet in Arrow
        self._pending_column_rows = 0
        self._tables: dict[date, list[pa.Table]] = {}  # converted rows by scoring date, not yet on disk
        self._converted = 0
        self._remove_leftovers()
        self._thread = threading.Thread(target=self._run, name="scoring-log", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return self._held

    @property
    def problem(self) -> str | None:
        """Why the log is not keeping up (rows dropped while it is full), or None."""
        if self._held >= self.max_pending_rows:
            return (
                f"the scoring log under {self.root} holds {self._held} rows it could not write yet (the cap, "
                f"serving.log_max_pending_rows); {self.dropped} dropped so far: see the service's log"
            )
        return None

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        """Rows as dicts of the schema's columns."""
        batch = list(rows)
        if batch:
            kept, nudge = self._hold(len(batch))
            self._take(batch[:kept], kept, nudge)

    def append_columns(self, batch: Columns) -> None:
        """A scored batch as columns (the scorer's way: no dict a row)."""
        if batch.rows:
            kept, nudge = self._hold(batch.rows)
            self._take(batch if kept == batch.rows else batch.head(kept), kept, nudge)

    def _hold(self, count: int) -> tuple[int, bool]:
        """How many of `count` new rows fit under the cap (the rest dropped and counted), now held; and
        whether they bring the rows waiting to `flush_rows`."""
        with self._held_lock:
            kept = max(0, min(count, self.max_pending_rows - self._held))
            if kept < count:
                self.dropped += count - kept
                if self.dropped == count - kept:  # the first drop is logged; /status counts on
                    log.error(
                        "scoring log under %s is full (%d rows waiting): dropping rows", self.root, self._held
                    )
            self._held += kept
            return kept, self._held >= self.flush_rows > self._held - kept

    def _take(self, batch: list[dict[str, Any]] | Columns, kept: int, nudge: bool) -> None:
        if kept:
            self._incoming.append(batch)
        if nudge:  # enough to write now rather than at the interval's end
            self._queue.put(threading.Event())

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every row appended so far was written (or its write failed and is held)."""
        done = threading.Event()
        self._queue.put(done)  # a marker: the writer writes what it has, then sets it
        if not done.wait(timeout):
            raise TimeoutError(f"the scoring log under {self.root} did not flush in {timeout} s")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _remove_leftovers(self) -> None:
        """Temporary files a killed writer left (one service writes a log: none is being written now)."""
        for leftover in self.root.glob(f"{PARTITION}=*/.part-*.tmp"):
            leftover.unlink(missing_ok=True)

    def _run(self) -> None:
        from serving.threads import lower_priority

        lower_priority()
        last = time.monotonic()
        while True:
            wait = max(0.0, self.flush_interval_s - (time.monotonic() - last))
            try:
                items = [self._queue.get(timeout=min(wait, POLL_S))]
            except queue.Empty:
                items = []
            while True:  # and whatever else is there, without waiting
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in items
            waiting = [item for item in items if item is not None]
            for _ in range(len(self._incoming)):  # what is there now
                item = self._incoming.popleft()
                if isinstance(item, Columns):
                    self._pending_columns.append(item)
                    self._pending_column_rows += item.rows
                else:
                    self._pending += item
            if len(self._pending) >= CONVERT_ROWS or self._pending_column_rows >= CONVERT_COLUMN_ROWS:
                self._convert()
            if (
                stop
                or waiting
                or self._waiting_rows() >= self.flush_rows
                or time.monotonic() - last >= self.flush_interval_s
            ):
                self._write()
                self._expire()
                last = time.monotonic()
            for event in waiting:
                event.set()
            if stop:
                return

    def _waiting_rows(self) -> int:
        return len(self._pending) + self._pending_column_rows + self._converted

    def _convert(self, everything: bool = False) -> None:
        """What was taken so far into Arrow: rows CONVERT_ROWS at a time, scored batches CONVERT_COLUMN_ROWS
        at a time (a smaller remainder waits for more unless `everything`). Reading Python objects into
        Arrow holds the GIL: one conversion of a whole flush (thousands of rows) stalled every request for
        tens of milliseconds, a small one is a fraction of a millisecond (docs/benchmarks.md, "Scoring
        service"). A row that does not fit the schema fails alone: it is dropped, counted (`dropped`,
        `errors`) and named in the log, and the rest of its chunk is kept."""
        self._convert_columns(everything)
        self._convert_rows(self._pending)
        self._pending = []

    def _convert_columns(self, everything: bool) -> None:
        batches, self._pending_columns, self._pending_column_rows = self._pending_columns, [], 0
        by_day: dict[date, list[Columns]] = {}
        for batch in batches:
            by_day.setdefault(batch.day, []).append(batch)
        for day, group in by_day.items():
            chunk: list[Columns] = []
            size = 0
            for batch in group:
                chunk.append(batch)
                size += batch.rows
                if size >= CONVERT_COLUMN_ROWS:
                    self._add_columns(day, chunk)
                    chunk, size = [], 0
            if chunk and everything:
                self._add_columns(day, chunk)
            elif chunk:
                self._pending_columns += chunk
                self._pending_column_rows += size

    def _add_columns(self, day: date, chunk: list[Columns]) -> None:
        try:
            table = columns_table(chunk)
        except Exception:  # a value that does not fit: sort the chunk row by row, the rest is kept
            self._convert_rows([row for batch in chunk for row in batch.as_rows()])
            return
        self._tables.setdefault(day, []).append(table)
        self._converted += table.num_rows

    def _convert_rows(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa

        by_day: dict[date, list[dict[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(row["scored_at"].astimezone(UTC).date(), []).append(row)
        for day, day_rows in by_day.items():
            for start in range(0, len(day_rows), CONVERT_ROWS):
                chunk = day_rows[start : start + CONVERT_ROWS]
                try:
                    table = pa.Table.from_pylist(chunk, schema=schema())
                except Exception:
                    table = self._without_misfits(chunk)
                self._tables.setdefault(day, []).append(table)
                self._converted += table.num_rows

    def _without_misfits(self, chunk: list[dict[str, Any]]) -> pa.Table:
        import pyarrow as pa

        kept = []
        for row in chunk:
            try:
                kept.append(pa.Table.from_pylist([row], schema=schema()))
            except Exception as exc:
                self.errors += 1
                self.dropped += 1
                with self._held_lock:
                    self._held -= 1
                log.error(
                    "scoring log: the row of transaction %r does not fit the log's schema (%s): dropped",
                    str(row.get("transaction_id"))[:64],
                    exc,
                )
        return pa.concat_tables(kept) if kept else schema().empty_table()

    def _write(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self._convert(everything=True)
        tables, self._tables, self._converted = self._tables, {}, 0
        for day, parts in sorted(tables.items()):
            folder = partition_dir(self.root, day)
            table = pa.concat_tables(parts)
            if not table.num_rows:
                continue
            try:
                folder.mkdir(parents=True, exist_ok=True)
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
                name = f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
                scratch = folder / f".{name}.tmp"
                try:
                    pq.write_table(table, scratch, use_dictionary=list(DICTIONARY_COLUMNS))
                    scratch.rename(folder / name)
                finally:
                    scratch.unlink(missing_ok=True)  # a failed write leaves no temporary file
                self.written += table.num_rows
                with self._held_lock:
                    self._held -= table.num_rows
                self._newest = day if self._newest is None else max(self._newest, day)
                self._announce(day, table)
            except Exception:  # disk full, permissions: keep the rows (within the cap), say where
                self.errors += 1
                log.exception(
                    "scoring log: writing %d rows under %s failed; kept for the next flush",
                    table.num_rows,
                    folder,
                )
                self._tables.setdefault(day, []).extend(parts)
                self._converted += table.num_rows

    def _announce(self, day: date, table: pa.Table) -> None:
        if self.on_written is None:
            return
        import pyarrow.compute as pc

        versions = {*pc.unique(table["model_version"]).to_pylist()}
        versions |= {v for v in pc.unique(table["shadow_version"]).to_pylist() if v}
        try:
            self.on_written(self.root, day, versions)
        except Exception:  # lineage never costs a row of the log
            log.exception("scoring log: the lineage of %s could not be announced", day)

    def _expire(self) -> None:
        """Partitions scored more than retention_days before the newest one written are deleted."""
        if self.retention_days is None or self._newest is None:
            return
        for name in expire_dated_folders(self.root, f"{PARTITION}=", self.retention_days, self._newest):
            self.removed_partitions += 1
            log.info("scoring log: removed %s (older than %d days)", name, self.retention_days)


# --- the chargeback journal ---------------------------------------------------------------------------------
#
# Chargebacks posted to the service move merchant state at once; the lake learns them only when the next
# labels file lands. So that a restart in between loses none, each accepted report is appended (and synced)
# to `date=<scoring date>/_chargebacks-<pid>.jsonl` beside the scoring log's files: the leading underscore
# keeps Parquet readers of the log from ever listing it, and the log's retention deletes it with its date.

CHARGEBACK_PREFIX = "_chargebacks-"


def journal_chargebacks(root: Path, reports: list[dict[str, Any]], received: datetime) -> None:
    """Append `reports` (transaction_id, label_timestamp) received at `received` (the service's clock)."""
    import json
    import os

    folder = partition_dir(root, received.astimezone(UTC).date())
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(
        json.dumps(
            {
                "transaction_id": r["transaction_id"],
                "label_timestamp": r["label_timestamp"].astimezone(UTC).isoformat(),
                "received_at": received.astimezone(UTC).isoformat(),
            }
        )
        + "\n"
        for r in reports
    )
    with (folder / f"{CHARGEBACK_PREFIX}{os.getpid()}.jsonl").open("a") as out:
        out.write(lines)
        out.flush()
        os.fsync(out.fileno())


def read_journal(root: Path, first: date, last: date) -> tuple[list[tuple[str, datetime]], int]:
    """(transaction_id, label time) of the chargebacks received on scoring dates first .. last, in label-time
    order, and how many lines could not be read (a line torn by a crash mid-write is skipped)."""
    import json

    reports, torn = [], 0
    for folder in sorted(root.glob(f"{PARTITION}=*")):
        if not (
            folder.is_dir()
            and first.isoformat() <= folder.name.removeprefix(f"{PARTITION}=") <= last.isoformat()
        ):
            continue
        for path in sorted(folder.glob(f"{CHARGEBACK_PREFIX}*.jsonl")):
            for line in path.read_text().splitlines():
                try:
                    record = json.loads(line)
                    reports.append(
                        (record["transaction_id"], datetime.fromisoformat(record["label_timestamp"]))
                    )
                except (ValueError, KeyError, TypeError):
                    torn += 1
    reports.sort(key=lambda r: (r[1], r[0]))
    return reports, torn
