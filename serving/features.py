"""The model inputs of scored transactions: the entity state (the fraud_model_v1 features) plus the
transaction's own values, the one definition the training set uses (training.dataset).

Two sources of entity state:

- `LiveFeatures` (the default, `serving.live_state`): the state the training set joins for a transaction is
  the entity's state right after its previous transaction, same-day activity included. The online store is
  loaded once a day, so reading it would serve yesterday's state to a model that learned from today's. The
  service therefore keeps the state current itself: `features.live.LiveState`, bootstrapped from the lake's
  silver history, computes each scored transaction's new gold row by the gold definition, serves the state
  before each transaction from it, and writes every new row through to the online store (Feast's layout)
  off the response path, so the store and Feast's own server show the state as of the last scored
  transaction. Parity with the training set is tested by replaying a day through the running service.
- `StoreFeatures` (`serving.live_state=false`): the online store as materialized, with the views' TTL applied
  (Feast's online read does not apply it). Same-day activity is then missing: the documented skew.

Either way an entity without state (new, or silent longer than its view's TTL) is scored with its features
missing, as the model was trained to see them (NaN: normalised to 0 with a missing indicator), and the
response says so.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from features.definitions import (
    CUSTOMER_JOIN_KEY,
    CUSTOMER_TTL,
    CUSTOMER_VIEW,
    INTEGER_FEATURES,
    MERCHANT_JOIN_KEY,
    MERCHANT_TTL,
    MERCHANT_VIEW,
)
from model_contract.inputs import (
    CATEGORICAL_VOCAB,
    FEATURE_LAG,
    MODEL_INPUTS,
    NUMERIC_FEATURES,
    transaction_inputs,
)
from pipelines.gold.contract import CREATED_TIMESTAMP, CUSTOMER_FEATURES, EVENT_TIMESTAMP, MERCHANT_FEATURES
from serving.threads import lower_priority

if TYPE_CHECKING:
    from core.settings import Settings
    from features.live import LiveState

log = logging.getLogger(__name__)

MS = 1000


@dataclass
class Assembled:
    """A batch's model inputs and what they were made of."""

    x: np.ndarray  # float32, MODEL_INPUTS order, NaN where missing
    features: list[dict[str, float | int | None]]  # per transaction: NUMERIC_FEATURES as served
    missing: list[list[str]]  # per transaction: join keys the state source did not know
    numeric: np.ndarray  # float64, a row per transaction, NUMERIC_FEATURES order, NaN where missing


class EntityState(Protocol):
    def rows(self, txns: Sequence[dict[str, Any]]) -> list[tuple[dict | None, dict | None]]:
        """Per transaction (in the order given, each seeing the ones before it): the customer's and the
        merchant's state before it, or None."""

    def refusal(self, txns: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
        """(index, why) of the first transaction `rows` would refuse, checked before any is kept."""

    def advance(self, now: datetime) -> None:
        """The service's clock moved (what has expired may be forgotten)."""

    def maintenance_due(self, now: datetime) -> bool:
        """Whether `advance(now)` leaves work for `maintain` (the live state's daily fold into columns)."""

    def maintain(self) -> None:
        """Do what `advance` left: never on the event loop (seconds at a million transactions a day)."""

    def observe_chargeback(self, transaction_id: str, label_time: datetime) -> bool: ...

    def forget(self, customers: Iterable[str]) -> dict[str, int]:
        """Erase these customers (pseudonyms) from what the state keeps (`mlops erase`); counts taken."""

    def close(self) -> None: ...


NOTHING_FORGOTTEN = {"customers": 0, "transactions": 0, "chargebacks": 0}

Rows = list[tuple[dict | None, dict | None]]


_SLOT = {name: j for j, name in enumerate(MODEL_INPUTS)}
_CUSTOMER_SLOTS = np.array([_SLOT[name] for name in CUSTOMER_FEATURES])
_MERCHANT_SLOTS = np.array([_SLOT[name] for name in MERCHANT_FEATURES])
_NUMERIC_SLOTS = [_SLOT[name] for name in NUMERIC_FEATURES]
_NUMERIC_INTEGER = [name in INTEGER_FEATURES for name in NUMERIC_FEATURES]


def assemble(rows: Rows, txns: Sequence[dict[str, Any]]) -> Assembled:
    """Model inputs of validated transactions (serving.contract), in order, from their entity state.

    One float64 table in MODEL_INPUTS order, filled a row per entity: a request usually holds one
    transaction, and a numpy array per feature made small requests pay for 25 arrays each (the scorer's
    largest cost but the model's: docs/benchmarks.md, "Scoring service")."""
    event_ms = np.array([int(t["event_timestamp"].timestamp() * MS) for t in txns], dtype="int64")
    own = transaction_inputs(
        np.array([t["amount"] for t in txns], dtype="float64"),
        [t["currency"] for t in txns],
        [t["country"] for t in txns],
        event_ms,
        {column: [t[column] for t in txns] for column in CATEGORICAL_VOCAB},
    )
    table = np.full((len(txns), len(MODEL_INPUTS)), np.nan)
    for name, values in own.items():
        table[:, _SLOT[name]] = values
    missing: list[list[str]] = []
    for i, (customer, merchant) in enumerate(rows):
        gone = []
        if customer is None:
            gone.append(CUSTOMER_JOIN_KEY)
        else:
            table[i, _CUSTOMER_SLOTS] = [_value(customer.get(name)) for name in CUSTOMER_FEATURES]
        if merchant is None:
            gone.append(MERCHANT_JOIN_KEY)
        else:
            table[i, _MERCHANT_SLOTS] = [_value(merchant.get(name)) for name in MERCHANT_FEATURES]
        missing.append(gone)
    numeric = table[:, _NUMERIC_SLOTS]
    features = [
        {
            name: None if value != value else int(value) if integer else value
            for name, integer, value in zip(NUMERIC_FEATURES, _NUMERIC_INTEGER, values, strict=True)
        }
        for values in numeric.tolist()
    ]
    return Assembled(table.astype("float32"), features, missing, numeric)


def _value(value: float | int | None) -> float:
    return math.nan if value is None else value


class LiveFeatures:
    """Entity state kept current as transactions are scored (see the module docstring)."""

    def __init__(self, live: LiveState, store_writes: StoreWrites | None) -> None:
        self.live = live
        self.store_writes = store_writes

    def rows(self, txns: Sequence[dict[str, Any]]) -> list[tuple[dict | None, dict | None]]:
        out = []
        written: list[tuple[dict, dict]] = []
        for txn in txns:
            out.append(self.live.state_before(txn["customer_id"], txn["merchant_id"], txn["event_timestamp"]))
            written.append(self.live.observe(txn))
        if self.store_writes is not None:
            self.store_writes.put(written)
        return out

    @property
    def store_writes_dropped(self) -> int | None:
        return None if self.store_writes is None else self.store_writes.dropped

    def refusal(self, txns: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
        return self.live.refusal(txns)

    def advance(self, now: datetime) -> None:
        self.live.advance(now, fold=False)

    def maintenance_due(self, now: datetime) -> bool:
        return self.live.fold_due(now)

    def maintain(self) -> None:
        self.live.fold()

    # The fold beside the state (features/live/state.py): the scorer freezes and installs under its lock and
    # builds on a thread of its own.
    def begin_fold(self) -> Any:
        return self.live.begin_fold()

    def build_fold(self, job: Any) -> None:
        self.live.build_fold(job)

    def finish_fold(self, job: Any) -> None:
        self.live.finish_fold(job)

    def observe_chargeback(self, transaction_id: str, label_time: datetime) -> bool:
        return self.live.observe_chargeback(transaction_id, label_time)

    def forget(self, customers: Iterable[str]) -> dict[str, int]:
        return self.live.forget(customers)

    def settle(self, timeout_s: float) -> bool:
        """Wait until the rows already handed to the online store's writer are written (an erasure then
        removes the store's rows knowing none of the person's is still on its way); False past the wait."""
        return self.store_writes is None or self.store_writes.drain(timeout_s)

    def close(self) -> None:
        if self.store_writes is not None:
            self.store_writes.close()


class StoreFeatures:
    """The online store as materialized, TTL applied."""

    def __init__(self, settings: Settings) -> None:
        from features.online import open_online

        self.online = open_online(settings)
        self._reader = self.online._reader  # the direct reader: it also returns the stored event times

    def rows(self, txns: Sequence[dict[str, Any]]) -> list[tuple[dict | None, dict | None]]:
        if not txns:
            return []
        entity_rows = [
            {CUSTOMER_JOIN_KEY: t["customer_id"], MERCHANT_JOIN_KEY: t["merchant_id"]} for t in txns
        ]
        if self._reader is None:
            raise RuntimeError(
                "the online store's layout is not one the scoring service reads directly (SQLite or Redis "
                "with Feast's defaults); set MLOPS_SERVING__LIVE_STATE=true or use one of those stores"
            )
        got = self._reader.read(entity_rows, with_times=True)
        out = []
        for i, txn in enumerate(txns):
            t = txn["event_timestamp"]
            pair = []
            for view, names, ttl in (
                (CUSTOMER_VIEW, CUSTOMER_FEATURES, CUSTOMER_TTL),
                (MERCHANT_VIEW, MERCHANT_FEATURES, MERCHANT_TTL),
            ):
                stamp = got[f"__ts__{view}"][i]
                # Feast's online read returns whatever is stored; the training join looks at t - 1 ms and
                # takes a row at or before it and no older than the TTL from it.
                at = t - FEATURE_LAG
                fresh = stamp is not None and at - ttl <= stamp <= at
                pair.append({name: got[name][i] for name in names} if fresh else None)
            out.append((pair[0], pair[1]))
        return out

    def refusal(self, txns: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
        return None  # reads only: any transaction can be given the store's rows

    def advance(self, now: datetime) -> None:
        pass

    def maintenance_due(self, now: datetime) -> bool:
        return False

    def maintain(self) -> None:
        pass

    def observe_chargeback(self, transaction_id: str, label_time: datetime) -> bool:
        return False  # the store's merchant state moves with the daily materialization only

    def forget(self, customers: Iterable[str]) -> dict[str, int]:
        return dict(NOTHING_FORGOTTEN)  # nothing kept here: the erasure removes the store's rows itself

    def close(self) -> None:
        pass


# A write-through flush takes at most this many (customer, merchant) row pairs: bounded work per write.
FLUSH_ROWS = 4096


class StoreWrites:
    """Writes the live state's new rows through to the online store from a background thread, in batches,
    keeping only each entity's newest row of a batch. A failed write is logged and counted; the rows
    stay served from memory and the next materialization rewrites the store. At most `max_backlog`
    batches wait for the thread: past that a batch's rows are dropped and counted (`dropped`), for the
    same reason: the store is a copy of what memory serves."""

    def __init__(
        self,
        settings: Settings,
        flush_interval_s: float = 0.2,
        retry_s: float = 60.0,
        max_backlog: int = 1024,
        open_wait_s: float = 120.0,
    ) -> None:
        self.settings = settings
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self.writers: dict[str, tuple[Any, str, tuple[str, ...]]] = {}
        self.written = 0
        self.errors = 0
        self.dropped = 0
        self.problem: str | None = None
        self._next_try = 0.0
        self.max_backlog = max_backlog
        # Batches go on a deque that wakes nobody (a queue's put woke the writer for every scored batch, a
        # thread hand-off per request); the writer takes what is there every `flush_interval_s`.
        self._backlog: deque[list[tuple[dict, dict]]] = deque()
        self._writing = False
        self._stop = threading.Event()
        self._opened = threading.Event()
        self._thread = threading.Thread(target=self._run, name="online-writes", daemon=True)
        self._thread.start()
        # The writers are opened (Feast imported, the registry read: seconds of CPU under the GIL) before the
        # state is handed to the scorer, not on the first write in the middle of traffic, where it stalled
        # every request for as long (docs/benchmarks.md, "Scoring service"). Opened on the writer's thread:
        # SQLite's connections belong to the thread that opens them.
        self._opened.wait(timeout=open_wait_s)

    def _open(self) -> bool:
        """The views' writers, opened on first use: the store may not be set up yet when the service
        starts (no `mlops features` run so far); until it is, rows are served from memory only."""
        if self.writers:
            return True
        if time.monotonic() < self._next_try:
            return False
        from features.online_store import open_writer
        from features.repo import open_store

        try:
            store = open_store(self.settings)
            self.writers = {
                view: (open_writer(store, store.get_feature_view(view)), key, names)
                for view, key, names in (
                    (CUSTOMER_VIEW, CUSTOMER_JOIN_KEY, CUSTOMER_FEATURES),
                    (MERCHANT_VIEW, MERCHANT_JOIN_KEY, MERCHANT_FEATURES),
                )
            }
            self.problem = None
            return True
        except Exception as exc:
            self._next_try = time.monotonic() + self.retry_s
            self.problem = f"the online store cannot be written yet ({exc}); live state is served from memory"
            log.warning("%s; trying again in %.0f s", self.problem, self.retry_s)
            return False

    def put(self, rows: list[tuple[dict, dict]]) -> None:
        if len(self._backlog) >= self.max_backlog:
            if not self.dropped:
                log.error("online store writes are %d batches behind: dropping rows", len(self._backlog))
            self.dropped += len(rows)
            return
        self._backlog.append(rows)

    def drain(self, timeout_s: float) -> bool:
        """Wait until every batch put so far is written (or its write failed); False past `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self._backlog or self._writing:
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        lower_priority()
        try:
            self._open()
        finally:
            self._opened.set()
        while True:
            # One write per `flush_interval_s`, not one per scored batch: a write's fixed cost (Arrow
            # columns, the encoding, a SQLite transaction) is paid under the GIL, and at 500 one-transaction
            # requests a second, writing each batch alone took half of the process's GIL time.
            stop = self._stop.wait(self.flush_interval_s)
            waiting = len(self._backlog)  # what is there now; later batches wait for the next interval
            while waiting:
                self._writing = True  # before the backlog lets go of them: `drain` sees one or the other
                pairs: list[tuple[dict, dict]] = []
                while waiting and len(pairs) < FLUSH_ROWS:
                    pairs += self._backlog.popleft()
                    waiting -= 1
                try:
                    self._write(pairs)
                finally:
                    self._writing = False
            if stop:
                for writer, _, _ in self.writers.values():  # SQLite connections close on their own thread
                    writer.close()
                return

    def _write(self, pairs: list[tuple[dict, dict]]) -> None:
        import pyarrow as pa

        if not self._open():
            return

        ts = pa.timestamp("us", tz="UTC")
        for index, (view, (writer, key, names)) in enumerate(self.writers.items()):
            newest: dict[str, dict] = {}
            for pair in pairs:
                row = pair[index]
                newest[row[key]] = row  # in scoring order: the last is the newest
            rows = list(newest.values())
            now = datetime.now(UTC)
            table = pa.table(
                {
                    key: pa.array([r[key] for r in rows], pa.string()),
                    EVENT_TIMESTAMP: pa.array([r[EVENT_TIMESTAMP] for r in rows], ts),
                    CREATED_TIMESTAMP: pa.array([now] * len(rows), ts),
                    **{
                        name: pa.array(
                            [r.get(name) for r in rows],
                            pa.int64() if name in INTEGER_FEATURES else pa.float64(),
                        )
                        for name in names
                    },
                }
            )
            try:
                writer.write(table)
                self.written += table.num_rows
            except Exception:
                self.errors += 1
                log.exception("writing %d live %s rows to the online store failed", table.num_rows, view)


class PendingState:
    """The entity state while the real one loads: the service answers 503 before reaching it. An erasure
    that comes meanwhile is kept and applied to the loaded state before it serves (the load may have read
    the person's rows before the lake lost them)."""

    def __init__(self) -> None:
        self.forgotten: set[str] = set()

    def forget(self, customers: Iterable[str]) -> dict[str, int]:
        self.forgotten.update(customers)
        return dict(NOTHING_FORGOTTEN)

    def rows(self, txns: Sequence[dict[str, Any]]) -> list[tuple[dict | None, dict | None]]:
        raise RuntimeError("the live state is still loading")

    def refusal(self, txns: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
        raise RuntimeError("the live state is still loading")

    def advance(self, now: datetime) -> None:
        pass

    def maintenance_due(self, now: datetime) -> bool:
        return False

    def maintain(self) -> None:
        pass

    def observe_chargeback(self, transaction_id: str, label_time: datetime) -> bool:
        raise RuntimeError("the live state is still loading")

    def close(self) -> None:
        pass


def restore_scored(live: LiveState, settings: Settings, now: datetime) -> dict[str, int]:
    """The transactions scored since the last landing, from the scoring log, observed into `live`
    (bootstrapped from the lake): those with an event date after the last arrival in silver (which the
    lake does not hold yet), in event-time order. One the lake already holds is a resend and changes
    nothing; one older than its entities' kept history is skipped and counted. Then the chargebacks posted
    since, from the scoring log's chargeback journal (serving.scoring_log.journal_chargebacks)."""
    from datetime import timedelta

    from features.live import CHARGEBACK_REACH_DAYS, silver_arrivals
    from pipelines.lake import Tables
    from serving.scoring_log import read_journal, read_scoring_log

    today = now.astimezone(UTC).date()
    arrivals = silver_arrivals(Tables(settings.lake).silver)
    first = max(
        arrivals[-1] + timedelta(days=1) if arrivals else today - timedelta(days=CHARGEBACK_REACH_DAYS),
        today - timedelta(days=CHARGEBACK_REACH_DAYS),
    )
    if first > today + timedelta(days=1):
        return {"rows": 0, "observed": 0, "skipped": 0, "chargebacks": 0, "chargebacks_attributed": 0}
    columns = [
        "transaction_id", "customer_id", "merchant_id", "event_timestamp", "amount", "currency", "country",
    ]  # fmt: skip
    table = read_scoring_log(settings.scoring_log_dir, first, today + timedelta(days=1), columns)
    rows = sorted(table.to_pylist(), key=lambda r: (r["event_timestamp"], r["transaction_id"]))
    observed = skipped = 0
    for row in rows:
        if live.refusal([row]) is not None:
            skipped += 1
            continue
        live.observe(row)
        observed += 1
    # Then the chargebacks posted since (after the transactions they report): one the lake's labels already
    # hold is a resend of it and changes nothing.
    reports, torn = read_journal(settings.scoring_log_dir, first, today + timedelta(days=1))
    attributed = sum(live.observe_chargeback(tid, label_time) for tid, label_time in reports)
    if rows or reports:
        log.info(
            "live state: %d transactions scored since %s restored from the scoring log (%d too old to take), "
            "%d chargebacks (%d attributed, %d torn lines skipped)",
            observed,
            first,
            skipped,
            len(reports),
            attributed,
            torn,
        )
    return {
        "rows": len(rows),
        "observed": observed,
        "skipped": skipped,
        "chargebacks": len(reports),
        "chargebacks_attributed": attributed,
    }


def open_state(
    settings: Settings, start: datetime | None = None, restore: bool = False
) -> tuple[EntityState, dict[str, int]]:
    """The entity state source the settings ask for (see the module docstring), with what `restore` brought
    back from the scoring log (`restore_scored`)."""
    if not settings.serving.live_state:
        return StoreFeatures(settings), {}
    from features.live import LiveState, memory_returnable

    if not memory_returnable():
        log.warning(
            "Arrow allocates from its own pool here, which keeps what the live state's load frees (about as "
            "much again as the state): run the service with ARROW_DEFAULT_MEMORY_POOL=system, as `mlops "
            "serve` does"
        )
    start = start or datetime.now(UTC)
    live = LiveState.from_lake(settings, start, max_bytes=settings.serving.max_state_bytes)
    restored = restore_scored(live, settings, start) if restore else {}
    return LiveFeatures(live, StoreWrites(settings)), restored
