"""The scoring log: every scored transaction, appended off the response path, as Parquet by event date.

Layout: `$MLOPS_HOME/scoring_log/date=YYYY-MM-DD/part-<first scored time>-<uuid>.parquet`, one folder per
event date of the transactions (what monitoring and the label join read by), files written whole by a
background thread (a temporary name, then an atomic rename: a reader never sees half a file).

A row holds what the decision was made from and with: the transaction's identity and time, every model
input as the service computed it (`training.dataset.NUMERIC_FEATURES` as float64, null where missing, and
the raw categorical values), the champion's score and decision with its version, the shadow challenger's
score and version (null where none), which entities the online store did not know, the server-side
latency, and the caller whose token sent it (the audit of every scoring call).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.dataset import CATEGORICAL_FEATURES, NUMERIC_FEATURES

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

PARTITION = "date"
ID_COLUMNS = ("transaction_id", "customer_id", "merchant_id")
RAW_COLUMNS = ("amount", "currency", *CATEGORICAL_FEATURES)  # the request's values the features came from


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
            pa.field("missing_entities", pa.string()),  # comma-separated join keys not in the store
            pa.field("latency_ms", pa.float64(), nullable=False),
            pa.field("caller", pa.string()),  # the token's caller (serving/auth.py); null without auth
        ]
    )


def partition_dir(root: Path, day: date) -> Path:
    return root / f"{PARTITION}={day.isoformat()}"


def read_scoring_log(root: Path, first: date, last: date, columns: list[str] | None = None) -> pa.Table:
    """The rows of event dates first .. last (an empty table with the schema where there are none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    days = sorted(
        p
        for p in root.glob(f"{PARTITION}=*")
        if p.is_dir() and first.isoformat() <= p.name.removeprefix(f"{PARTITION}=") <= last.isoformat()
    )
    files = [f for d in days for f in sorted(d.glob("*.parquet"))]
    target = schema() if columns is None else pa.schema([schema().field(c) for c in columns])
    if not files:
        return target.empty_table()
    return pa.concat_tables(
        pq.read_table(f, columns=columns, schema=schema()).select(target.names) for f in files
    )


class ScoringLog:
    """Takes rows (dicts of the schema's columns) from the request path without blocking on disk: rows
    go to an unbounded in-memory queue; a daemon thread writes what queued every `flush_interval_s`, or
    as soon as `flush_rows` are waiting, one file per event date. `close()` writes what is left.

    A write that fails is logged with the folder and kept for the next flush (never dropped silently);
    `errors` counts failures and `written` the rows on disk."""

    def __init__(self, root: Path, flush_rows: int = 5000, flush_interval_s: float = 5.0) -> None:
        self.root = root
        self.flush_rows = flush_rows
        self.flush_interval_s = flush_interval_s
        self.written = 0
        self.errors = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._pending: list[dict[str, Any]] = []
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="scoring-log", daemon=True)
        self._thread.start()

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        for row in rows:
            self._idle.clear()
            self._queue.put(row)

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every row appended so far is on disk (or its write failed)."""
        self._queue.put({})  # a marker: wakes the writer to flush now
        deadline = time.monotonic() + timeout
        while not self._idle.wait(0.05):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the scoring log under {self.root} did not flush in {timeout} s")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        last = time.monotonic()
        while True:
            wait = max(0.0, self.flush_interval_s - (time.monotonic() - last))
            try:
                item = self._queue.get(timeout=wait)
            except queue.Empty:
                item = {}
            if item is None:
                self._write()
                self._idle.set()
                return
            now_flush = not item
            if item:
                self._pending.append(item)
            while len(self._pending) < self.flush_rows:  # take what else queued, without waiting
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    now_flush = True
                    break
                if not more:
                    now_flush = True
                    continue
                self._pending.append(more)
            if (
                now_flush
                or len(self._pending) >= self.flush_rows
                or time.monotonic() - last >= self.flush_interval_s
            ):
                self._write()
                last = time.monotonic()
                if self._queue.empty() and not self._pending:
                    self._idle.set()

    def _write(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        rows, self._pending = self._pending, []
        by_day: dict[date, list[dict[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(row["event_timestamp"].astimezone(UTC).date(), []).append(row)
        failed: list[dict[str, Any]] = []
        for day, day_rows in sorted(by_day.items()):
            folder = partition_dir(self.root, day)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
                name = f"part-{stamp}-{uuid.uuid4().hex[:8]}.parquet"
                table = pa.Table.from_pylist(day_rows, schema=schema())
                scratch = folder / f".{name}.tmp"
                pq.write_table(table, scratch)
                scratch.rename(folder / name)
                self.written += len(day_rows)
            except Exception:  # disk full, permissions: keep the rows, say where
                self.errors += 1
                log.exception(
                    "scoring log: writing %d rows under %s failed; kept for the next flush",
                    len(day_rows),
                    folder,
                )
                failed += day_rows
        self._pending = failed + self._pending
