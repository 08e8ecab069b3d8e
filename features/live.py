"""Entity state kept current while transactions are scored: each transaction's gold rows, computed in memory.

The training set joins every transaction with the gold row of each entity's latest transaction strictly
before it (event time - 1 ms, within the view's TTL). Gold is built once a day, so a scoring service that
read the online store would serve yesterday's state to a model that learned from today's. `LiveState`
keeps each entity's recent history and computes, for every transaction it observes, the customer and
merchant rows gold will hold for it (pipelines/gold/transforms.py), so that what it serves for a
transaction is what the training set gives that transaction (train/serve parity). No Spark: plain Python
and numpy over sorted columns: about 40 us per `observe` (measured, below).

The gold definition it reproduces, per transaction at t (milliseconds, UTC; Spark's `unix_millis`):
  - windows are (t - w, t] over event milliseconds: Spark's range frames include every transaction of the
    same millisecond, so two transactions of an entity at one millisecond get the same window values;
  - amounts in USD: the billing amount (exact, 2 decimals) / CURRENCY_PER_USD of its currency;
  - abroad: the merchant's country is not a home country of the card's currency; a transaction without a
    country counts as abroad (gold's `concat_ws` skips the null, and "USD" alone is no home pair);
  - customer 1h/24h std: Spark's `stddev_samp` (null for one transaction); 7d/30d std from the sums,
    sqrt(max(0, (sum of squares - sum^2 / n) / (n - 1))), null for one transaction;
  - customer seconds since previous: to the latest earlier transaction in (time, transaction_id) order, so
    of two at one millisecond the one with the larger id sees 0 s; gold takes it from the rows of D-1 and
    D, or from the daily totals of the arrivals D-30 .. D+late of older dates: a previous transaction is
    found when it arrived on or after D-30 (an event date up to `late_event_days` earlier than that still
    counts when it arrived late), else the value is null;
  - merchant chargebacks: fraud chargebacks reported in (t - 30d, t] (report time <= t counts), each
    attributed to the merchant of every silver copy of its transaction that arrived within the 32 days up
    to the chargeback's arrival (pipelines/gold/state.py); fraud rate = that / transactions in (t - 30d, t].

Times are tz-aware datetimes everywhere in the API (a naive one is refused): event times keep their
microseconds, which the training join compares (the row of a transaction is joined at t' when
event_us <= t'_us - 1000), while windows use whole milliseconds, as gold does.

How it is kept (issue #32 item 5: a million transactions a day, 30 days, within 2 GiB):
  - customers: one column per field for all of them (`_History`, numpy), each customer's rows together
    and sorted by (event time, transaction_id): time (us), USD amount, flags (abroad; whether another row
    of the customer in the same millisecond has a smaller id), arrival day, merchant code, and the id's
    64-bit hash with an index of rows by hash (resends, `rows_of`, chargeback attribution). The ids
    themselves are kept only in each customer's window, its rows from `late_event_days` before its last
    one: only there can an observed transaction land (an older one is refused), so only there is the
    order of two ids ever asked. What is observed goes to a per-customer tail (Python arrays) after its
    history rows; a late one that sorts inside the window first moves the window into the tail. Once a day
    (`advance`, or `fold` where the service defers it) the tails are folded into new columns and what no
    later row can read is dropped (`_compact`). Windows are found by binary search; sums over them are
    sums of the slices (O(k) for the k transactions of the window), which keeps the 7d/30d variance
    formula on the same sums gold uses: running totals would subtract large prefixes and turn a zero
    variance into rounding noise;
  - merchants: per merchant, time (us) and the running total of the USD amounts, and the report times
    of its chargebacks: every window is two binary searches and a subtraction, O(log n) for a merchant
    with thousands of transactions a month. Its rows depend only on the time, so no ids;
  - a transaction id is found by its 64-bit hash, and outside the windows a matching hash is taken for
    the id (inside, the ids are compared): a new id matches one of 31 million kept with a probability of
    about 2e-12, so a resend is told from a new transaction wrongly about once in a million days.
Entities keep about `retain_days` (30 + 2 x late days + 2) before their latest transaction; an entity silent
longer is dropped at the fold (its rows are past their TTL). The row of each entity's last transaction is
cached until something changes it, so `state_before` right after `observe` costs a copy, not a
recomputation.

Measured (benchmarks/serving.py --state-footprint: 31 days of synthetic silver, a customer a month per 30
transactions, a merchant per thousand; docs/benchmarks.md has the figures and the old layout's beside
them): 54 bytes of columns a transaction, about 56 of resident memory after the load and 100 at its
peak; the load 5.2 s for 4 million (two passes over the files: compact columns first, then only the ids
the windows keep); a day's fold 2.1 s at 4 million. `observe` 41 us median, `state_before` 13 us.
"""

from __future__ import annotations

import logging
import math
from array import array
from bisect import bisect_left, bisect_right, insort
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from features.definitions import CUSTOMER_JOIN_KEY, CUSTOMER_TTL, MERCHANT_JOIN_KEY, MERCHANT_TTL
from pipelines.contracts import CURRENCY_PER_USD, HOME_COUNTRIES
from pipelines.gold.contract import (
    EVENT_TIMESTAMP,
    LOOKBACK_DAYS,
    WINDOWS,
    Feature,
    features_of,
)
from pipelines.lake import Tables

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from core.settings import Settings

log = logging.getLogger(__name__)

DAY_MS = 86_400_000
US_PER_MS = 1_000
# pipelines.gold.state.CHARGEBACK_REACH_DAYS, not imported: that module imports Spark, which a scoring
# process does not load. tests/integration/test_live_features.py checks that the two agree.
CHARGEBACK_REACH_DAYS = 32
FEATURE_LAG_US = 1_000  # the training set joins at event time - 1 ms (training.dataset.FEATURE_LAG)
_MONTH_MS = WINDOWS["30d"] * 1_000
_CUSTOMER_TTL_US = CUSTOMER_TTL // timedelta(microseconds=1)
_MERCHANT_TTL_US = MERCHANT_TTL // timedelta(microseconds=1)
# Bootstrap reach: the row of an entity's last transaction before the start may be served up to its TTL
# later, and that row reads its 30-day windows and the previous transaction's arrival 30 days further back.
_TRANSACTION_REACH_DAYS = max(CUSTOMER_TTL, MERCHANT_TTL).days + LOOKBACK_DAYS + 2
_LABEL_REACH_DAYS = MERCHANT_TTL.days + LOOKBACK_DAYS + 1
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HOME = frozenset(f"{country}:{currency}" for country, currency in HOME_COUNTRIES.items())
# An entity's columns are cut when the expired part is at least this share of them: each cut is O(n), so
# amortised O(1) per transaction, and at most a third more memory than the retained part.
_TRIM_SHARE = 4
_SLICE_ROWS = 1 << 20  # rows per slice where the load would otherwise copy a value for every row
_TRIM_MIN = 16

Row = dict[str, Any]


# Memory per transaction read at the load's peak (benchmarks/serving.py --state-footprint: 100 bytes at 4
# million; the state itself keeps 55-60 after it): what the sizing check at start multiplies the rows to
# read by.
BYTES_PER_TRANSACTION = 100


class StateTooLargeError(RuntimeError):
    """The history the live state would hold does not fit the memory it may use; the message says what to
    do."""


class LateTransactionError(ValueError):
    """A transaction older than its entity's kept history can reach (see `LiveState.observe`)."""


def _micros(when: datetime, what: str) -> int:
    """Epoch microseconds of a tz-aware datetime, exactly (no float)."""
    if not isinstance(when, datetime) or when.utcoffset() is None:
        raise ValueError(
            f"{what} must be a timezone-aware datetime (UTC), got {when!r}; attach the zone, "
            "e.g. datetime.fromisoformat('2026-01-05T12:00:00+00:00')"
        )
    delta = when - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _datetime(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def usd(amount: Any, currency: str) -> float:
    """The amount in US dollars as gold computes it: the exact 2-decimal amount as a double (a float, int,
    Decimal or numeric string: each converts to the double nearest the decimal value, as Spark's cast of
    decimal(12,2) does), divided by the currency's units per dollar."""
    return float(amount) / _rate(currency)


def _rate(currency: str) -> float:
    rate = CURRENCY_PER_USD.get(currency)
    if rate is None:
        raise ValueError(
            f"currency {currency!r} has no reference rate; known: {', '.join(CURRENCY_PER_USD)} "
            "(pipelines/contracts.py CURRENCY_PER_USD)"
        )
    return rate


def is_foreign(country: str | None, currency: str) -> int:
    """1 when the merchant's country is not a home country of the card's currency; a missing country
    counts as abroad, as in gold (transforms._is_foreign)."""
    return 0 if country is not None and f"{country}:{currency}" in _HOME else 1


_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_U64 = 2**64 - 1


def id_hash(transaction_id: str) -> int:
    """64-bit FNV-1a of the id's UTF-8 bytes: the key of the history's id index (`_id_hashes` computes the
    same values for a whole column)."""
    h = _FNV_OFFSET
    for byte in transaction_id.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h


def _id_hashes(ids: pa.Array):
    """`id_hash` of every string of `ids` (a large_string array without nulls), vectorised over the bytes."""
    import numpy as np

    n = len(ids)
    if n == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int64)[ids.offset : ids.offset + n + 1]
    data_buffer = ids.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    lengths = np.diff(offsets)
    out = np.full(n, _FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(_FNV_PRIME)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        starts = offsets[:-1][rows]
        h = out[rows]
        for k in range(length):
            h ^= data[starts + k].astype(np.uint64)
            h *= prime
        out[rows] = h
    return out


class _Ids:
    """Transaction ids in one Arrow buffer (UTF-8 bytes and 64-bit offsets): a few bytes each instead of a
    Python string object."""

    __slots__ = ("array", "data", "offsets")

    def __init__(self, array: pa.Array) -> None:
        import pyarrow as pa

        if isinstance(array, pa.ChunkedArray):
            array = array.combine_chunks()
        if array.type != pa.large_string():
            array = array.cast(pa.large_string())
        self.array = array
        import numpy as np

        self.offsets = np.frombuffer(array.buffers()[1], dtype=np.int64)[
            array.offset : array.offset + len(array) + 1
        ].data
        data = array.buffers()[2]
        self.data = memoryview(data if data is not None else b"")

    def __getitem__(self, i: int) -> str:
        offsets = self.offsets
        return str(self.data[offsets[i] : offsets[i + 1]], "utf-8")

    def __len__(self) -> int:
        return len(self.array)


class _History:
    """Customers' transactions in columns, one row per transaction, each customer's rows together and sorted
    by (event time, transaction_id): what was bootstrapped from the lake, and after each day's compaction
    what was observed since (`LiveState._compact`). Per row: time (us), USD amount, flags (bit 0 abroad,
    bit 1 another row of its customer in the same millisecond has a smaller id), arrival date, merchant (a
    code of `LiveState`'s merchant registry) and the id's 64-bit hash, with an index of rows by hash.

    The ids themselves are kept only for each customer's window: its rows from `lateness` before its last
    one (to the millisecond). Only there can an observed transaction land (an older one is refused), so
    only there is the order of two ids ever asked; everywhere else, what the order decides is in bit 1."""

    __slots__ = (
        "_hashes_view",
        "_index_view",
        "_starts_view",
        "arrival",
        "code_of",
        "flags",
        "hashes",
        "index_rows",
        "keys",
        "merchant",
        "starts",
        "us",
        "usd",
        "window_base",
        "window_ids",
        "window_start",
    )

    def __init__(
        self,
        keys: list[str],
        lengths: np.ndarray,
        columns: dict[str, np.ndarray],
        window_start: np.ndarray,
        window_ids: pa.Array,
    ) -> None:
        """`columns`: us, usd, flags, arrival, merchant, hashes (one value per row, rows grouped by customer
        in the order of `keys`, `lengths` rows each); `window_start`: each customer's first window row;
        `window_ids`: the ids of the window rows, in row order."""
        import numpy as np

        self.keys = keys
        self.code_of = {key: code for code, key in enumerate(keys)}
        self.starts = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])
        self.us = np.ascontiguousarray(columns["us"], dtype=np.int64)
        self.usd = np.ascontiguousarray(columns["usd"], dtype=np.float64)
        self.flags = np.ascontiguousarray(columns["flags"], dtype=np.int8)
        arrival = np.asarray(columns["arrival"])
        fits = not len(arrival) or (int(arrival.min()) >= 0 and int(arrival.max()) <= np.iinfo(np.uint16).max)
        self.arrival = np.ascontiguousarray(arrival, dtype=np.uint16 if fits else np.int32)  # days: to 2149
        self.merchant = np.ascontiguousarray(columns["merchant"], dtype=np.int32)
        self.hashes = np.ascontiguousarray(columns["hashes"], dtype=np.uint64)
        order = np.argsort(self.hashes, kind="stable")
        self.index_rows = order.astype(np.int32 if len(order) < 2**31 else np.int64)
        del order
        self.window_start = np.ascontiguousarray(window_start, dtype=np.int64)
        self.window_base = np.cumsum(self.starts[1:] - self.window_start) - (
            self.starts[1:] - self.window_start
        )
        self.window_ids = _Ids(window_ids)
        self._hashes_view = self.hashes.data
        self._index_view = self.index_rows.data
        self._starts_view = self.starts.data

    def __len__(self) -> int:
        return len(self.us)

    def span(self, code: int) -> tuple[int, int]:
        return self._starts_view[code], self._starts_view[code + 1]

    def window(self, code: int) -> tuple[int, int]:
        """(first window row, index of its id in `window_ids`) of a customer."""
        return int(self.window_start[code]), int(self.window_base[code])

    def rows_of(self, transaction_id: str) -> list[int]:
        """The rows holding `transaction_id` (its copies): those whose id hashes to the same 64 bits (for a
        window row, whose id is the same)."""
        h = id_hash(transaction_id)
        hashes, index = self._hashes_view, self._index_view
        i = bisect_left(index, h, key=hashes.__getitem__)
        found = []
        while i < len(index) and hashes[index[i]] == h:
            row = index[i]
            code = bisect_right(self._starts_view, row) - 1
            start, base = self.window(code)
            if row < start or self.window_ids[base + row - start] == transaction_id:
                found.append(row)
            i += 1
        return found

    def customer_of(self, row: int) -> str:
        return self.keys[bisect_right(self._starts_view, row) - 1]

    @staticmethod
    def first_in_millisecond(codes: np.ndarray, us: np.ndarray, ids: pa.Array) -> np.ndarray:
        """Per row: whether no other row of its customer in the same millisecond has a smaller id."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        if not len(codes):
            return np.zeros(0, dtype=bool)
        ms = np.floor_divide(us, US_PER_MS)
        table = pa.table({"c": codes, "ms": ms, "id": ids})
        order = pc.sort_indices(table, [("c", "ascending"), ("ms", "ascending"), ("id", "ascending")])
        order = order.to_numpy()
        c, m = codes[order], ms[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = (c[1:] != c[:-1]) | (m[1:] != m[:-1])
        out = np.empty(len(order), dtype=bool)
        out[order] = first
        return out


def _window_start(starts: np.ndarray, us: np.ndarray, lateness_us: int) -> np.ndarray:
    """Each customer's first row from `lateness_us` before its last (rounded down to the millisecond);
    `starts`: the customers' first rows and, last, the end."""
    import numpy as np

    lengths = np.diff(starts)
    code = np.repeat(np.arange(len(lengths)), lengths)
    last = us[starts[1:][lengths > 0] - 1]
    threshold = np.zeros(len(lengths), dtype=np.int64)
    threshold[lengths > 0] = np.floor_divide(last - lateness_us, US_PER_MS) * US_PER_MS
    inside = us >= threshold[code]
    return starts[1:] - np.bincount(code[inside], minlength=len(lengths))


_Columns = tuple[Sequence[int], Sequence[float], Sequence[int], Sequence[int], Sequence[int]]


class _Customer:
    """One customer's transactions sorted by (event time, transaction_id): rows [a, b) of the history first,
    then its tail, what was observed since the last compaction (Python arrays). A transaction that sorts
    inside the history's part first moves the history's window (the rows whose ids it keeps) into the tail
    (`_spill`): an accepted transaction never sorts before the window, so the tail always follows."""

    __slots__ = (
        "_cached",
        "a",
        "arrival",
        "b",
        "code",
        "foreign",
        "history",
        "ids",
        "key",
        "latest",
        "merchant",
        "us",
        "usd",
    )

    def __init__(self, key: str, history: _History | None = None, code: int = -1) -> None:
        self.key = key
        self.history, self.code = history, code
        self.a, self.b = history.span(code) if history is not None else (0, 0)
        self.us = array("q")
        self.usd = array("d")
        self.foreign = array("b")
        self.merchant = array("i")  # merchant codes (LiveState._merchant_keys)
        self.arrival = array("i")  # arrival date, days since the epoch
        self.ids: list[str] = []
        # The row of the last transaction, while it holds: a service reads it (state_before) right after
        # computing it (observe). Dropped by whatever changes it.
        self.latest: Row | None = None
        # The history part's columns as lists, while there is no tail (a view that nothing changes).
        self._cached: _Columns | None = None

    def __len__(self) -> int:
        return self.b - self.a + len(self.us)

    def last_us(self) -> int:
        if self.us:
            return self.us[-1]
        assert self.history is not None
        return int(self.history.us[self.b - 1])

    def columns(self) -> _Columns:
        """(time us, USD amount, abroad, merchant code, arrival) of every transaction, history then tail."""
        h = self.history
        if self.a == self.b or h is None:
            return self.us, self.usd, self.foreign, self.merchant, self.arrival
        if not self.us and self._cached is not None:
            return self._cached
        a, b = self.a, self.b
        base = (
            h.us[a:b].tolist(),
            h.usd[a:b].tolist(),
            (h.flags[a:b] & 1).tolist(),
            h.merchant[a:b].tolist(),
            h.arrival[a:b].tolist(),
        )
        if not self.us:
            self._cached = base
            return base
        return (
            base[0] + self.us.tolist(),
            base[1] + self.usd.tolist(),
            base[2] + self.foreign.tolist(),
            base[3] + self.merchant.tolist(),
            base[4] + self.arrival.tolist(),
        )

    def id_at(self, i: int) -> str | None:
        """The id of transaction i; None for a history row before the window (its id is not kept)."""
        kept = self.b - self.a
        if i >= kept:
            return self.ids[i - kept]
        assert self.history is not None
        start, base = self.history.window(self.code)
        row = self.a + i
        return self.history.window_ids[base + row - start] if row >= start else None

    def _known_id_at(self, i: int) -> str:
        tid = self.id_at(i)
        if tid is None:
            raise RuntimeError(
                f"the live state of customer {self.key} lacks the id of its transaction {i}: a transaction "
                "was let in further back than the lateness allows (LiveState.observe checks it first)"
            )
        return tid

    def insert(
        self, us: int, tid: str, amount: float, foreign: int, merchant: int, day: int
    ) -> tuple[int, _Columns]:
        """Insert a transaction in order: its index, and the columns with it (what `row` reads)."""
        columns: _Columns | None = self.columns()
        assert columns is not None
        times = columns[0]
        i = bisect_right(times, us)
        while i > 0 and times[i - 1] == us and self._known_id_at(i - 1) > tid:
            i -= 1
        if i < self.b - self.a:
            self._spill(i)
            columns = None
        k = i - (self.b - self.a)
        self.latest = self._cached = None
        values = (us, amount, foreign, merchant, day)
        tail: list[Any] = [self.us, self.usd, self.foreign, self.merchant, self.arrival]
        for column, value in zip(tail, values, strict=True):
            column.insert(k, value)
        self.ids.insert(k, tid)
        if columns is None or self.a == self.b:  # none, or the tail's own arrays (which have it now)
            return i, self.columns()
        copies: list[Any] = list(columns)  # lists: the history part and the tail, copied
        for column, value in zip(copies, values, strict=True):
            column.insert(i, value)
        return i, columns

    def _spill(self, i: int) -> None:
        """Move the history's window into the tail: transaction i, to be inserted, sorts inside it."""
        h = self.history
        assert h is not None
        start, base = h.window(self.code)
        start = max(start, self.a)
        if self.a + i < start:
            self._known_id_at(i)  # raises: only the window's ids are kept
        a, b = start, self.b
        self.us = array("q", h.us[a:b].tobytes()) + self.us
        self.usd = array("d", h.usd[a:b].tobytes()) + self.usd
        self.foreign = array("b", (h.flags[a:b] & 1).tobytes()) + self.foreign
        self.merchant = array("i", h.merchant[a:b].tobytes()) + self.merchant
        self.arrival = array("i", h.arrival[a:b].astype("int32").tobytes()) + self.arrival
        first = base + a - h.window_start[self.code]
        self.ids = [h.window_ids[k] for k in range(first, first + b - a)] + self.ids
        self.b = start

    def position(self, us: int, transaction_id: str) -> int:
        """Index of a kept transaction, or -1 (a history row outside the window matches on the id's hash)."""
        times = self.columns()[0]
        i = bisect_left(times, us)
        hashed = None
        while i < len(times) and times[i] == us:
            tid = self.id_at(i)
            if tid is None:
                assert self.history is not None
                hashed = id_hash(transaction_id) if hashed is None else hashed
                if self.history.hashes[self.a + i] == hashed:
                    return i
            elif tid == transaction_id:
                return i
            i += 1
        return -1

    def row_at(self, i: int, columns: _Columns | None = None) -> Row:
        """Transaction i's row, a copy of the cached one where it is the last."""
        if i != len(self) - 1:
            return self.row(i, columns)
        if self.latest is None:
            self.latest = self.row(i, columns)
        return dict(self.latest)

    def row(self, i: int, columns: _Columns | None = None) -> Row:
        """Gold's customer row of transaction i (transforms.customer_features): windows over whole
        milliseconds, (t - w, t], found by binary search on the microsecond times."""
        times, usd_, foreign, merchants, arrival = columns or self.columns()
        t = times[i] // US_PER_MS
        hi = bisect_left(times, (t + 1) * US_PER_MS)  # every transaction of the same millisecond is inside
        inputs = {"amount_usd": usd_, "is_foreign": foreign, "merchant_id": merchants}
        row: Row = {CUSTOMER_JOIN_KEY: self.key, EVENT_TIMESTAMP: _datetime(times[i])}
        starts = _starts(times, t, hi, _CUSTOMER_PLAN.windows)
        memo: dict[tuple[str, str], Any] = {}
        for name, feature in _CUSTOMER_PLAN.features:
            if feature.aggregation == "time_since_previous":
                row[name] = self._seconds_since_previous(i, times, arrival)
            else:
                window = feature.window or ""
                lo = starts[window]
                values = inputs[feature.input][lo:hi] if feature.input in inputs else ()
                row[name] = _aggregate(feature, values, hi - lo, memo, window)
        return row

    def _seconds_since_previous(self, i: int, times: Sequence[int], arrival: Sequence[int]) -> float | None:
        t = times[i] // US_PER_MS
        first = bisect_left(times, t * US_PER_MS)
        end = bisect_left(times, (t + 1) * US_PER_MS)
        if end - first > 1:  # another transaction in the same millisecond: is one earlier in id order?
            tid = self.id_at(i)
            if tid is None:  # a history row before the window: its millisecond is all history, as built
                assert self.history is not None
                if self.history.flags[self.a + i] & 2:
                    return 0.0
            elif any(j != i and self._known_id_at(j) < tid for j in range(first, end)):
                return 0.0
        # Gold reads older dates from the daily totals of arrivals D-30 .. D+late only.
        reach = t // DAY_MS - LOOKBACK_DAYS
        j = first - 1
        while j >= 0 and arrival[j] < reach:
            j -= 1
        return (t - times[j] // US_PER_MS) / 1000.0 if j >= 0 else None


class _Merchant:
    """One merchant's transactions sorted by event time: time (us) and the running total of their USD
    amounts, and the report times of its chargebacks. A merchant's row depends only on its transaction's
    time (every window takes whole milliseconds), so its transactions need no ids: ties keep their order
    of arrival. 16 bytes a transaction."""

    __slots__ = ("chargebacks", "cum", "key", "latest", "us")

    def __init__(self, key: str) -> None:
        self.key = key
        self.us = array("q")
        self.cum = array("d", [0.0])  # cum[i]: USD sum of the first i transactions
        self.chargebacks = array("q")  # report times (ms) of attributed fraud chargebacks, sorted
        self.latest: Row | None = None

    def __len__(self) -> int:
        return len(self.us)

    def last_us(self) -> int:
        return self.us[-1]

    def insert(self, us: int, amount: float) -> int:
        self.latest = None
        i = bisect_right(self.us, us)
        self.us.insert(i, us)
        if i == len(self.us) - 1:
            self.cum.append(self.cum[-1] + amount)
            return i
        # A late transaction: every running total from it on grows by its amount, in C (no Python loop).
        # The totals differ from a history observed in order by rounding only (a window is a difference
        # of two of them; tests/unit/test_live_state_inserts.py).
        import numpy as np

        self.cum.insert(i + 1, self.cum[i])
        view = np.frombuffer(self.cum, dtype=np.float64)
        view[i + 1 :] += amount
        del view  # an array may grow again only once no view of it is left
        return i

    def position(self, us: int) -> int:
        """Index of a kept transaction at `us` (any of several at that time: their rows are the same), or
        -1."""
        i = bisect_left(self.us, us)
        return i if i < len(self.us) and self.us[i] == us else -1

    def trim(self, cutoff_ms: int) -> None:
        """Cut the transactions at or before `cutoff_ms` when they are enough to be worth it (each cut is
        O(n): amortised O(1) per transaction, at most a third more memory than the retained part)."""
        import numpy as np

        drop = bisect_left(self.us, (cutoff_ms + 1) * US_PER_MS)
        if drop < _TRIM_MIN or drop * _TRIM_SHARE < len(self.us):
            return
        del self.us[:drop]
        totals = np.frombuffer(self.cum, dtype=np.float64)[drop:] - self.cum[drop]
        self.cum = array("d", totals.tobytes())
        if self.us:
            del self.chargebacks[: bisect_right(self.chargebacks, self.us[0] // US_PER_MS - _MONTH_MS)]

    def row_at(self, i: int) -> Row:
        if i != len(self.us) - 1:
            return self.row(i)
        if self.latest is None:
            self.latest = self.row(i)
        return dict(self.latest)

    def row(self, i: int) -> Row:
        """Gold's merchant row of transaction i (transforms.merchant_features)."""
        times, cum, chargebacks = self.us, self.cum, self.chargebacks
        t = times[i] // US_PER_MS
        hi = bisect_left(times, (t + 1) * US_PER_MS)
        starts = _starts(times, t, hi, _MERCHANT_PLAN.windows)
        row: Row = {MERCHANT_JOIN_KEY: self.key, EVENT_TIMESTAMP: _datetime(times[i])}
        for name, feature in _MERCHANT_PLAN.features:
            window = feature.window or ""
            lo, width = starts[window], WINDOWS[window] * 1_000
            n = hi - lo
            if feature.input == "chargeback":
                reported = bisect_right(chargebacks, t) - bisect_right(chargebacks, t - width)
                row[name] = reported if feature.aggregation == "count" else reported / n
            elif feature.aggregation == "count":
                row[name] = n
            else:  # the USD amount: sum or mean, from the running totals
                total = cum[hi] - cum[lo]
                row[name] = total if feature.aggregation == "sum" else total / n
        return row


class _Plan:
    """What an entity's rows compute, from its declarations (pipelines/gold/contract.py FEATURES): each
    feature by its input, aggregation and window, in declared order, and the windows to find. The live state
    holds no code per feature: a declared feature is computed by its aggregation over its input's values in
    its window, as gold computes it (sliding windows exactly per frame, whole-day windows from sums)."""

    def __init__(self, entity: str, declared: Sequence[Feature], supported: Mapping[str, set[str]]) -> None:
        self.entity = entity
        self.features = tuple((f.name, f) for f in declared)
        self.windows = tuple(sorted({f.window for f in declared if f.window}, key=WINDOWS.__getitem__))
        lacking = [
            f"{f.name} ({f.aggregation} of {f.input} over {f.window})"
            for f in declared
            if f.aggregation not in supported.get(f.input, set())
        ]
        computes = "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in sorted(supported.items()))
        self.problem = (
            f"the live state of the {entity} (features/live.py) keeps no values to compute "
            f"{', '.join(lacking)}; it computes {computes}"
            if lacking
            else None
        )


# What each entity's live columns can aggregate. A customer keeps every transaction's values (USD amount,
# abroad flag, merchant) for 30 days: any aggregation of them. A merchant keeps its transactions' times and
# running USD totals (16 bytes each: the busiest entities) and its chargebacks' report times.
_ANY = {"count", "sum", "mean", "std", "share", "per_transaction", "distinct_count", "max"}
_CUSTOMER_SUPPORTED = {
    "transaction": {"count", "time_since_previous"},
    "amount_usd": _ANY,
    "is_foreign": _ANY,
    "merchant_id": {"distinct_count"},
}
_MERCHANT_SUPPORTED = {
    "transaction": {"count"},
    "amount_usd": {"sum", "mean"},
    "chargeback": {"count", "per_transaction"},
}
_CUSTOMER_PLAN = _Plan("customer", features_of("customer"), _CUSTOMER_SUPPORTED)
_MERCHANT_PLAN = _Plan("merchant", features_of("merchant"), _MERCHANT_SUPPORTED)


def _starts(times: Sequence[int], t: int, hi: int, windows: Sequence[str]) -> dict[str, int]:
    """Index of the first transaction inside each window (t - w, t] (whole milliseconds), shortest first,
    each search bounded by the previous one's."""
    starts: dict[str, int] = {}
    bound = hi
    for window in windows:
        bound = starts[window] = bisect_left(times, (t - WINDOWS[window] * 1_000 + 1) * US_PER_MS, 0, bound)
    return starts


def _aggregate(feature: Feature, values: Sequence[Any], n: int, memo: dict, window: str) -> Any:
    """A customer feature's value from its input's values in its window (n transactions), as gold computes
    it. `memo` keeps the sums a row's features share."""
    aggregation = feature.aggregation
    if aggregation == "count":
        return n
    if aggregation == "distinct_count":
        return len(set(values))
    if aggregation == "max":
        return max(values)
    key = (feature.input, window)
    if key not in memo:
        memo[key] = (_stddev_samp if feature.sliding else _stddev_from_sums)(values)
    _n, total, mean, std = memo[key]
    if aggregation == "sum":
        return total
    if aggregation in ("mean", "share", "per_transaction"):
        return mean
    return std


def _stddev_samp(values: Sequence[float]) -> tuple[int, float, float, float | None]:
    """(count, sum, mean, Spark's stddev_samp) of a small window: exact per frame (two passes here), as
    gold's sliding frames compute it; null below two values."""
    n = len(values)
    total = sum(values)
    mean = total / n
    if n < 2:
        return n, total, mean, None
    return n, total, mean, math.sqrt(sum([(x - mean) ** 2 for x in values]) / (n - 1))


def _stddev_from_sums(values: Sequence[float]) -> tuple[int, float, float, float | None]:
    """(count, sum, mean, std) with gold's formula from sums, negative rounding clamped
    (transforms.customer_features): summed here over the window itself, not as a difference of running
    totals, so that a zero variance stays zero as in gold instead of becoming rounding noise."""
    n = len(values)
    total = sum(values)
    if n < 2:
        return n, total, total / n, None
    variance = (sum([x * x for x in values]) - total * total / n) / (n - 1)
    return n, total, total / n, math.sqrt(max(variance, 0.0))


# A transaction id's copies: (customer, merchant, event us, arrival day); a tuple, or a list of them for an
# id that silver holds more than once (copies further apart than its dedup lookback: gold counts each).
_Copy = tuple[str, str, int, int]


class LiveState:
    """Per-entity history and gold's rows, in memory (see the module docstring).

    `late_event_days` (settings.ingest): how much older than an entity's latest transaction an observed
    one may be, and how far back a late arrival reaches; `dedup_lookback_days`: how long a transaction id
    (or a chargeback's) is remembered, so a resend within it is not counted twice, as silver drops it.
    """

    def __init__(self, late_event_days: int = 1, dedup_lookback_days: int = 30) -> None:
        for plan in (_CUSTOMER_PLAN, _MERCHANT_PLAN):
            if plan.problem:  # refused at start, not on every scored request
                raise ValueError(plan.problem)
        self.late_event_days = late_event_days
        self.dedup_lookback_days = dedup_lookback_days
        self.retain_days = LOOKBACK_DAYS + 2 * late_event_days + 2
        self._retain_ms = self.retain_days * DAY_MS
        self._lateness_us = late_event_days * DAY_MS * US_PER_MS
        self._id_reach_days = max(CHARGEBACK_REACH_DAYS, dedup_lookback_days)
        self._history: _History | None = None
        self._customers: dict[str, _Customer] = {}  # customers observed since the last compaction
        self.merchants: dict[str, _Merchant] = {}
        self._merchant_keys: list[str] = []
        self._merchant_codes: dict[str, int] = {}
        self._copies: dict[str, _Copy | list[_Copy]] = {}  # ids observed since the last compaction
        self._reported: dict[str, int] = {}  # transaction id of a chargeback -> its report day
        self._reported_by_day: dict[int, list[str]] = {}
        self._now_ms = -(2**62)
        self._fold_pending = False  # a new day began and its fold (`_compact`) has not run yet
        # The last customer looked at that only the history holds: a request reads it three times
        # (refusal, state_before, observe), so one view and one read of its columns serve all three.
        self._view: _Customer | None = None
        # The last id looked up in the history, with what it found there (the history only changes at a fold).
        self._recent_id: tuple[str, _History, int, tuple[_Copy, ...]] | None = None

    # --- bootstrap ----------------------------------------------------------------------------------------

    @classmethod
    def from_lake(cls, settings: Settings, start: datetime, max_bytes: int | None = None) -> LiveState:
        """The state as of `start` from the lake's silver tables: every transaction with event time before
        `start` in the arrivals gold reads for dates from `start` on (and for the rows of each entity's
        last earlier transaction, still served within its TTL), and the fraud chargebacks reported before
        `start` that gold attributes to a merchant. Transactions and chargebacks at or after `start` are
        left to `observe` / `observe_chargeback`: pass the time the lake's data ends (the service's
        start), or the start of a day to replay it."""
        start_us = _micros(start, "start")
        map_large_allocations()
        state = cls(settings.ingest.late_event_days, settings.ingest.dedup_lookback_days)
        state._now_ms = start_us // US_PER_MS
        tables = Tables(settings.lake)
        arrivals = _arrivals(tables.silver)
        if not arrivals:
            log.warning("no silver transactions under %s: the live state starts empty", tables.silver)
            return state
        start_day = date.fromordinal(_EPOCH.date().toordinal() + start_us // (DAY_MS * US_PER_MS))
        first = start_day - timedelta(days=_TRANSACTION_REACH_DAYS)
        if max_bytes is not None:
            rows = _count(tables.silver, first, before=("event_timestamp", start))
            if rows * BYTES_PER_TRANSACTION > max_bytes:
                size = rows * BYTES_PER_TRANSACTION / 2**30
                raise StateTooLargeError(
                    f"the live state would hold {rows:,} transactions of {tables.silver} (about {size:.1f} "
                    f"GiB at {BYTES_PER_TRANSACTION} bytes each), over serving.max_state_bytes "
                    f"({max_bytes / 2**30:.1f} GiB): give the service more memory and raise the setting with "
                    "it, or serve with serving.live_state=false (the online store's state, without same-day "
                    "activity)"
                )
        read = state._load_transactions(tables.silver, first, start)
        state._load_chargebacks(tables, set(arrivals), start_day, start)
        release_freed_memory()
        log.info(
            "live state from %s: %d transactions before %s read, %d kept in %.0f MiB of columns, "
            "%d customers, %d merchants, %d chargebacks",
            tables.silver,
            read,
            start.isoformat(),
            state.kept_transactions(),
            state.nbytes() / 2**20,
            len(state._history.keys) if state._history is not None else 0,
            len(state.merchants),
            sum(len(m.chargebacks) for m in state.merchants.values()),
        )
        return state

    def _load_transactions(self, root: Path, first_day: date, start: datetime) -> int:
        """Bulk load of silver's transactions in the arrivals from `first_day` with event time before `start`,
        in two passes over the files so that the load's peak stays near the state's own size: the first
        keeps each row's compact columns (time, USD amount, flags, arrival, customer and merchant codes,
        the id's hash); after one sort per entity kind, the second reads the ids only of the rows that keep
        theirs (each customer's window and its same-millisecond ties). Returns the rows read."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        fragments, condition, schema = _fragments(root, first_day, ("event_timestamp", start))
        # Each file's customer and merchant ids dictionary-encoded; one set of codes for all files after.
        local: dict[str, list[tuple[pa.Array, np.ndarray]]] = {"customer": [], "merchant": []}
        parts: dict[str, list[np.ndarray]] = {
            name: [] for name in ("us", "usd", "flags", "arrival", "hashes")
        }
        sizes = []
        for fragment in fragments:
            table = fragment.to_table(
                schema=schema,
                columns=[
                    "transaction_id",
                    "customer_id",
                    "merchant_id",
                    "amount",
                    "currency",
                    "country",
                    "event_timestamp",
                    "arrival_date",
                ],
                filter=condition,
            )
            sizes.append(table.num_rows)
            if not table.num_rows:
                continue
            parts["us"].append(
                table["event_timestamp"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_numpy()
            )
            # Through the decimal text: Arrow's decimal-to-double cast is not correctly rounded; Spark's is.
            amounts = pc.cast(pc.cast(table["amount"], pa.string()), pa.float64()).to_numpy()
            currencies = table["currency"].combine_chunks().dictionary_encode()
            rates = np.array([_rate(c) for c in currencies.dictionary.to_pylist()])
            parts["usd"].append(amounts / rates[currencies.indices.to_numpy(zero_copy_only=False)])
            # Abroad from the (country, currency) pairs present, looked up per row (a null country is abroad).
            countries = table["country"].combine_chunks().dictionary_encode()
            known = countries.dictionary.to_pylist()
            pairs = np.array(
                [
                    [is_foreign(country, c) for c in currencies.dictionary.to_pylist()]
                    for country in [*known, None]
                ],
                dtype=np.int8,
            )
            country = pc.fill_null(countries.indices, len(known)).to_numpy(zero_copy_only=False)
            parts["flags"].append(pairs[country, currencies.indices.to_numpy(zero_copy_only=False)])
            parts["arrival"].append(table["arrival_date"].cast(pa.int32()).to_numpy().astype(np.int32))
            for kind in ("customer", "merchant"):
                encoded = table[f"{kind}_id"].combine_chunks().dictionary_encode()
                local[kind].append((encoded.dictionary, encoded.indices.to_numpy(zero_copy_only=False)))
            parts["hashes"].append(
                _id_hashes(table["transaction_id"].combine_chunks().cast(pa.large_string()))
            )
            del table, amounts, currencies, countries, pairs, country
            release_freed_memory()  # the file's columns (Arrow's threads free into their own arenas)
        rows = sum(sizes)
        if not rows:
            return 0
        col = {name: np.concatenate(parts.pop(name)) for name in list(parts)}
        customers, parts["customer"] = _codes(local.pop("customer"))
        self._merchant_keys, parts["merchant"] = _codes(local.pop("merchant"))
        self._merchant_codes = {key: code for code, key in enumerate(self._merchant_keys)}
        col.update({name: np.concatenate(parts.pop(name)) for name in ("customer", "merchant")})
        release_freed_memory()
        id_from = self._now_ms // DAY_MS - self._id_reach_days

        # Merchants: each one's arrays, from one sort by (merchant, time).
        order = _sort(col["merchant"], col["us"])
        m_sorted = col["merchant"][order]
        bounds = np.flatnonzero(np.diff(m_sorted)) + 1
        firsts, lasts = np.concatenate([[0], bounds]).tolist(), np.concatenate([bounds, [rows]]).tolist()
        codes = m_sorted[firsts].tolist()
        del m_sorted, bounds
        us_sorted, usd_sorted = col["us"][order], col["usd"][order]
        del order
        for a, b, code in zip(firsts, lasts, codes, strict=True):
            ms_slice = us_sorted[a:b] // US_PER_MS
            a += int(np.searchsorted(ms_slice, ms_slice[-1] - self._retain_ms, side="right"))
            key = self._merchant_keys[code]
            merchant = self.merchants[key] = _Merchant(key)
            merchant.us.frombytes(us_sorted[a:b].tobytes())
            merchant.cum = array("d", np.concatenate([[0.0], np.cumsum(usd_sorted[a:b])]).tobytes())
        del us_sorted, usd_sorted
        release_freed_memory()

        # Customers: the history, from one sort by (customer, time). Kept: what the retained span reaches
        # (after each customer's latest), and what a resend or a chargeback may still name (arrived within
        # the ids' reach).
        customer = col.pop("customer")
        order = _sort(customer, col["us"])
        group = customer[order]
        del customer
        us_sorted = col["us"][order]
        bounds = np.flatnonzero(np.diff(group)) + 1
        starts, ends = np.concatenate([[0], bounds]), np.concatenate([bounds, [rows]])
        # Kept in the retained span: a millisecond later than the customer's latest less the span.
        threshold = (us_sorted[ends - 1] // US_PER_MS - self._retain_ms + 1) * US_PER_MS
        keep = _at_least(us_sorted, threshold, ends - starts)
        keep |= col["arrival"][order] >= id_from
        order, group, us_sorted = order[keep], group[keep], us_sorted[keep]
        del bounds, starts, ends, threshold, keep
        release_freed_memory()
        lengths = np.bincount(group, minlength=len(customers))
        present = np.flatnonzero(lengths)
        lengths = lengths[present]
        starts = np.zeros(len(present) + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        window_start = _window_start(starts, us_sorted, self._lateness_us)
        in_window = _at_least(None, window_start, lengths)
        # Rows sharing a millisecond with another of their customer's: their order and bit 1 need the ids.
        tied = np.zeros(len(order), dtype=bool)
        ms = us_sorted // US_PER_MS
        same = (group[1:] == group[:-1]) & (ms[1:] == ms[:-1])
        del ms
        tied[1:] |= same
        tied[:-1] |= same
        del same
        wanted = np.flatnonzero(in_window | tied)  # positions in `order`
        ids = _ids_at(fragments, condition, schema, sizes, order[wanted])
        first = np.ones(len(order), dtype=bool)
        at = np.flatnonzero(tied)
        if len(at):
            tied_ids = ids.take(pa.array(np.searchsorted(wanted, at)))
            # Same-microsecond ties in id order (the sort above left them in file order).
            resort = pc.sort_indices(
                pa.table({"c": group[at], "us": us_sorted[at], "id": tied_ids}),
                [("c", "ascending"), ("us", "ascending"), ("id", "ascending")],
            ).to_numpy()
            order[at] = order[at][resort]
            us_sorted[at] = us_sorted[at][resort]
            tied_ids = tied_ids.take(pa.array(resort))
            first[at] = _History.first_in_millisecond(group[at], us_sorted[at], tied_ids)
            # The window's ids: a tied row's follows the new order of its ties.
            window_rows = np.flatnonzero(in_window)
            k = np.minimum(np.searchsorted(at, window_rows), len(at) - 1)
            source = np.where(at[k] == window_rows, len(ids) + k, np.searchsorted(wanted, window_rows))
            window_ids = pa.concat_arrays([ids, tied_ids]).take(pa.array(source))
        else:
            window_ids = ids.take(pa.array(np.searchsorted(wanted, np.flatnonzero(in_window))))
        del ids, tied, at, wanted, group
        del col["us"]
        flags = col.pop("flags")[order] | np.where(first, 0, 2).astype(np.int8)
        del first
        release_freed_memory()
        self._history = _History(
            [customers[c] for c in present.tolist()],
            lengths,
            {
                "us": us_sorted,
                "usd": col.pop("usd")[order],
                "flags": flags,
                "arrival": col.pop("arrival")[order],
                "merchant": col.pop("merchant")[order],
                "hashes": col.pop("hashes")[order],
            },
            window_start,
            window_ids,
        )
        return rows

    def _load_chargebacks(
        self, tables: Tables, with_silver: set[date], start_day: date, start: datetime
    ) -> None:
        """Fraud chargebacks reported before `start`, attributed as gold does: a chargeback that arrived on
        X goes to the merchant of each silver copy of its transaction in the arrivals X-32 .. X, and only
        arrivals that also have silver transactions are read (state.arrivals_with_silver)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        first = start_day - timedelta(days=max(_LABEL_REACH_DAYS, self.dedup_lookback_days))
        labels = _read(
            tables.silver_labels,
            ["transaction_id", "is_fraud", "label_timestamp", "arrival_date"],
            first,
            before=("label_timestamp", start),
        )
        if not labels.num_rows:
            return
        label_arrival = labels["arrival_date"].cast(pa.int32()).to_pylist()
        label_us = labels["label_timestamp"].cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
        ids = labels["transaction_id"].to_pylist()
        epoch = _EPOCH.date().toordinal()
        silver_days = {d.toordinal() - epoch for d in with_silver}
        dedup_from = start_day.toordinal() - epoch - self.dedup_lookback_days
        for tid, arrival, us in zip(ids, label_arrival, label_us, strict=True):
            if arrival >= dedup_from and tid not in self._reported:  # silver dedups by id, fraud or not
                self._mark_reported(tid, us // US_PER_MS // DAY_MS)
        fraud = [
            (tid, arrival, us)
            for tid, arrival, us, flag in zip(
                ids, label_arrival, label_us, labels["is_fraud"].to_pylist(), strict=True
            )
            if flag == 1 and arrival in silver_days
        ]
        if not fraud:
            return
        low = date.fromordinal(epoch + min(a for _, a, _ in fraud) - CHARGEBACK_REACH_DAYS)
        wanted = pa.array(sorted({tid for tid, _, _ in fraud}), pa.string())
        copies = _read(
            tables.silver,
            ["transaction_id", "merchant_id", "arrival_date"],
            low,
            where=pc.is_in(pc.field("transaction_id"), value_set=wanted),
        )
        merchants_of: dict[str, list[tuple[int, str]]] = {}
        for tid, merchant, arrival in zip(
            copies["transaction_id"].to_pylist(),
            copies["merchant_id"].to_pylist(),
            copies["arrival_date"].cast(pa.int32()).to_pylist(),
            strict=True,
        ):
            merchants_of.setdefault(tid, []).append((arrival, merchant))
        for tid, arrival, us in fraud:
            for copy_arrival, merchant in merchants_of.get(tid, ()):
                if arrival - CHARGEBACK_REACH_DAYS <= copy_arrival <= arrival:
                    self._merchant(merchant).chargebacks.append(us // US_PER_MS)
        for merchant in self.merchants.values():
            merchant.chargebacks = array("q", sorted(merchant.chargebacks))

    # --- observing ----------------------------------------------------------------------------------------

    def observe(self, txn: Mapping[str, Any]) -> tuple[Row, Row]:
        """Add a transaction and return its new gold rows (customer, merchant), each with its key and
        `event_timestamp`, as gold will compute them.

        `txn`: transaction_id, customer_id, merchant_id, event_timestamp (tz-aware datetime), amount
        (2 decimals, in `currency`), currency, country (None allowed). A transaction_id seen before (within
        `dedup_lookback_days`) is a resend, which silver drops: nothing changes and the rows of the first
        copy come back. A transaction older than an entity's latest is inserted in its place: its own rows
        are exact, the later transactions' rows (as `state_before` and `rows_of` compute them) now include
        it, as gold's rebuild of those dates will; rows returned earlier are not re-issued. One more than
        `late_event_days` older than an entity's latest is refused (ValueError): its windows reach past
        what is kept (LateTransactionError). Of two transactions of an entity in one millisecond, the first
        one's returned rows lack the second (gold's include it); `rows_of` and `state_before` give the
        complete rows. The state's clock does not move: a transaction's time is its caller's, and only
        `advance` (the service's own clock) forgets what has expired."""
        tid = txn["transaction_id"]
        us = _micros(txn["event_timestamp"], f"event_timestamp of transaction {tid}")
        day = us // US_PER_MS // DAY_MS  # a live transaction arrives on its event date
        known = self._resent(tid, day)
        rows = None if known is None else self._rows_of_copy(tid, known)
        if rows is not None:
            return rows
        amount = usd(txn["amount"], txn["currency"])
        foreign = is_foreign(txn.get("country"), txn["currency"])
        customer = self._customer(txn["customer_id"])
        merchant = self.merchants.get(txn["merchant_id"])
        for entity in (customer, merchant):
            if entity is not None and len(entity) and us < entity.last_us() - self._lateness_us:
                raise LateTransactionError(
                    f"transaction {tid} at {_datetime(us).isoformat()} is more than {self.late_event_days} "
                    f"day(s) older than the latest transaction of {entity.key} "
                    f"({_datetime(entity.last_us()).isoformat()}); the live state keeps too little history "
                    "to compute its rows. Gold will take it when it arrives; restart the service "
                    "(LiveState.from_lake) to serve rows that include it."
                )
        if customer is None:
            customer = _Customer(txn["customer_id"])
        if customer is self._view:
            self._view = None
        self._customers.setdefault(customer.key, customer)  # the view of its history, kept from now on
        merchant = self._merchant(txn["merchant_id"])
        ci, columns = customer.insert(us, tid, amount, foreign, self._merchant_code(merchant.key), day)
        mi = merchant.insert(us, amount)
        self._remember(tid, (customer.key, merchant.key, us, day))
        new_rows = customer.row_at(ci, columns), merchant.row_at(mi)
        merchant.trim(merchant.last_us() // US_PER_MS - self._retain_ms)
        return new_rows

    def refusal(self, txns: Sequence[Mapping[str, Any]]) -> tuple[int, str] | None:
        """(index, why) of the first of `txns` that `observe`, called on each in order, would refuse as
        older than its entities' kept history (LateTransactionError), or None; nothing is kept. A caller
        checks a request with it first, so a refused request leaves no transaction of it behind."""
        latest: dict[tuple[int, str], int] = {}
        for index, txn in enumerate(txns):
            tid = txn["transaction_id"]
            us = _micros(txn["event_timestamp"], f"event_timestamp of transaction {tid}")
            known = self._resent(tid, us // US_PER_MS // DAY_MS)
            if known is not None and self._rows_of_copy(tid, known) is not None:
                continue  # a resend: its first copy's rows come back
            for kind, key in ((0, txn["customer_id"]), (1, txn["merchant_id"])):
                entity = self._customer(key) if kind == 0 else self.merchants.get(key)
                kept = entity.last_us() if entity is not None and len(entity) else us
                last = max(kept, latest.get((kind, key), us))
                if us < last - self._lateness_us:
                    return index, (
                        f"transaction {tid} at {_datetime(us).isoformat()} is more than "
                        f"{self.late_event_days} day(s) older than the latest transaction of {key} "
                        f"({_datetime(last).isoformat()}): the live state keeps too little history to "
                        "compute its features. Send it to the lake's landing instead: gold takes it when it "
                        "arrives"
                    )
                latest[(kind, key)] = last
        return None

    def observe_chargeback(self, transaction_id: str, label_time: datetime) -> bool:
        """A fraud chargeback reported at `label_time` (tz-aware): from then on it counts for the merchant
        of its transaction, for 30 days. Returns whether it was attributed now: False for a transaction
        not among the last 32 days' (gold cannot attribute it either) and for a chargeback of a
        transaction already reported within `dedup_lookback_days` (silver drops the resend)."""
        us = _micros(label_time, f"label_time of the chargeback of {transaction_id}")
        label_ms = us // US_PER_MS
        day = label_ms // DAY_MS
        reported = self._reported.get(transaction_id)
        if reported is not None and day - self.dedup_lookback_days <= reported:
            return False
        self._mark_reported(transaction_id, day)
        attributed = False
        for _, merchant_key, _, arrival in self._known(transaction_id):
            if day - CHARGEBACK_REACH_DAYS <= arrival <= day:
                merchant = self._merchant(merchant_key)
                insort(merchant.chargebacks, label_ms)
                merchant.latest = None
                attributed = True
        return attributed

    # --- reading ------------------------------------------------------------------------------------------

    def state_before(self, customer_id: str, merchant_id: str, t: datetime) -> tuple[Row | None, Row | None]:
        """The rows the training set joins for a transaction at `t` (tz-aware): per entity, the row of its
        latest transaction with event time <= t - 1 ms, None when there is none or it is older than the
        view's TTL before t - 1 ms (features.offline._point_in_time). Of several transactions at that
        latest microsecond the one with the largest id is taken (gold's rows of such ties differ only in
        seconds since previous, and the training join keeps whichever its scan meets last)."""
        query = _micros(t, "t") - FEATURE_LAG_US
        customer_row = merchant_row = None
        customer = self._customer(customer_id)
        if customer is not None:
            columns = customer.columns()
            i = bisect_right(columns[0], query) - 1
            if i >= 0 and columns[0][i] >= query - _CUSTOMER_TTL_US:
                customer_row = customer.row_at(i, columns)
        merchant = self.merchants.get(merchant_id)
        if merchant is not None:
            i = bisect_right(merchant.us, query) - 1
            if i >= 0 and merchant.us[i] >= query - _MERCHANT_TTL_US:
                merchant_row = merchant.row_at(i)
        return customer_row, merchant_row

    def rows_of(self, transaction_id: str) -> tuple[Row, Row] | None:
        """The current gold rows of an observed or bootstrapped transaction (its first copy), None when it
        is not remembered: complete for same-millisecond ties and late arrivals observed since."""
        known = self._known(transaction_id)
        return self._rows_of_copy(transaction_id, known) if known else None

    def kept(self, customer_id: str) -> int:
        """How many transactions of a customer the state keeps (0 for one it does not know)."""
        customer = self._customer(customer_id)
        return 0 if customer is None else len(customer)

    def kept_transactions(self) -> int:
        """How many transactions the customers' state keeps in all."""
        history = self._history
        total = 0 if history is None else len(history)
        for key, customer in self._customers.items():
            total += len(customer.us)
            if history is not None and key in history.code_of:
                a, b = history.span(history.code_of[key])
                total -= (b - a) - (customer.b - customer.a)  # a part moved into the tail is counted there
        return total

    def nbytes(self) -> int:
        """Bytes the state's columns hold: the history, what was observed since, the merchants' arrays (not
        Python's overhead per object, nor the ids' map of chargebacks reported)."""
        total = 0
        history = self._history
        if history is not None:
            total += history.window_ids.array.nbytes + sum(
                values.nbytes
                for values in (
                    history.us,
                    history.usd,
                    history.flags,
                    history.arrival,
                    history.merchant,
                    history.hashes,
                    history.index_rows,
                    history.starts,
                    history.window_start,
                    history.window_base,
                )
            )
        for c in self._customers.values():
            total += sum(
                len(values) * values.itemsize for values in (c.us, c.usd, c.foreign, c.merchant, c.arrival)
            )
            total += sum(8 + len(tid) for tid in c.ids)
        for m in self.merchants.values():
            total += (len(m.us) + len(m.cum) + len(m.chargebacks)) * 8
        return total

    def _rows_of_copy(self, tid: str, known: list[_Copy]) -> tuple[Row, Row] | None:
        """The rows of a remembered transaction's first copy, None when its history is no longer kept."""
        customer_key, merchant_key, us, _ = known[0]
        customer, merchant = self._customer(customer_key), self.merchants.get(merchant_key)
        if customer is None or merchant is None:
            return None
        ci, mi = customer.position(us, tid), merchant.position(us)
        if ci < 0 or mi < 0:
            return None
        return customer.row_at(ci), merchant.row_at(mi)

    # --- housekeeping -------------------------------------------------------------------------------------

    def _customer(self, key: str) -> _Customer | None:
        """A customer's state, None for one the state does not know: the one observed since the last
        compaction, or a view of its history's rows that is not kept."""
        customer = self._customers.get(key)
        if customer is not None:
            return customer
        view = self._view
        if view is not None and view.key == key and view.history is self._history:
            return view
        history = self._history
        code = history.code_of.get(key) if history is not None else None
        if code is None:
            return None
        self._view = _Customer(key, history, code)
        return self._view

    def _merchant(self, key: str) -> _Merchant:
        merchant = self.merchants.get(key)
        if merchant is None:
            merchant = self.merchants[key] = _Merchant(key)
        return merchant

    def _merchant_code(self, key: str) -> int:
        code = self._merchant_codes.get(key)
        if code is None:
            code = self._merchant_codes[key] = len(self._merchant_keys)
            self._merchant_keys.append(key)
        return code

    def _remember(self, tid: str, copy: _Copy) -> None:
        known = self._copies.get(tid)
        if known is None:
            self._copies[tid] = copy
        elif isinstance(known, tuple):
            self._copies[tid] = [known, copy]
        else:
            known.append(copy)

    def _known(self, tid: str) -> list[_Copy]:
        """The remembered copies of `tid`, earliest arrival first: the history's (those that arrived within
        the ids' reach of the clock's day), then those observed since the last compaction."""
        copies: list[_Copy] = []
        history = self._history
        if history is not None:
            since = self._now_ms // DAY_MS - self._id_reach_days
            recent = self._recent_id
            if recent is not None and recent[0] == tid and recent[1] is history and recent[2] == since:
                copies.extend(recent[3])  # asked again (refusal, then observe): the history has not changed
            else:
                found = sorted((int(history.arrival[r]), int(history.us[r]), r) for r in history.rows_of(tid))
                copies.extend(
                    (history.customer_of(r), self._merchant_keys[history.merchant[r]], us, arrival)
                    for arrival, us, r in found
                    if arrival >= since
                )
                self._recent_id = (tid, history, since, tuple(copies))
        live = self._copies.get(tid)
        if live is not None:
            copies.extend([live] if isinstance(live, tuple) else live)
        return copies

    def _mark_reported(self, tid: str, day: int) -> None:
        self._reported[tid] = day
        self._reported_by_day.setdefault(day, []).append(tid)

    def _resent(self, tid: str, day: int) -> list[_Copy] | None:
        """The remembered copies of `tid` when a transaction of it arriving on `day` is a resend: one copy
        arrived within `dedup_lookback_days` before (silver drops the resend), whether or not the clock
        has moved far enough to forget the older ones."""
        copies = self._known(tid)
        return copies if any(day - self.dedup_lookback_days <= c[3] for c in copies) else None

    def advance(self, now: datetime, fold: bool = True) -> None:
        """Move the state's clock to `now`, the service's own time (never a request's): on a new day,
        what no later row can read is forgotten. A `now` earlier than the clock is ignored. With `fold`
        False, the new day's fold of what was observed into the columns (seconds at a million a day) is
        left to `fold`: a service runs it where no request waits on it."""
        self._advance(_micros(now, "now") // US_PER_MS, fold)

    def fold_due(self, now: datetime) -> bool:
        """Whether a fold waits, or `advance(now)` would start a new day."""
        return self._fold_pending or _micros(now, "now") // US_PER_MS // DAY_MS > self._now_ms // DAY_MS

    def fold(self) -> None:
        """Fold what was observed since into the history's columns, if a new day began since the last
        fold (`_compact`), and give the memory it freed back."""
        if self._fold_pending:
            self._fold_pending = False
            self._compact()
            release_freed_memory()  # the compaction's temporaries, now out of scope

    def _advance(self, ms: int, fold: bool = True) -> None:
        """Move the clock; on a new day, forget what no later row can read (once a day, O(entities)) and
        fold the day into the columns (now or at `fold`)."""
        if ms <= self._now_ms:
            return
        new_day = ms // DAY_MS != self._now_ms // DAY_MS
        self._now_ms = ms
        if new_day:
            self._forget(ms // DAY_MS)
            self._fold_pending = True
            if fold:
                self.fold()

    def _forget(self, today: int) -> None:
        cutoff = self._now_ms - self._retain_ms
        for key in [
            k
            for k, m in self.merchants.items()
            if (not m.us or m.us[-1] // US_PER_MS <= cutoff)
            and (not m.chargebacks or m.chargebacks[-1] <= cutoff)
        ]:
            del self.merchants[key]
        for day in [d for d in self._reported_by_day if d < today - self.dedup_lookback_days]:
            for tid in self._reported_by_day.pop(day):
                if self._reported.get(tid) == day:
                    del self._reported[tid]

    def _compact(self) -> None:
        """Fold what was observed since the last compaction into the history, in columns again, and drop
        what no later row can read: customers silent for the retained span, rows older than it before
        their customer's latest (unless they arrived within the ids' reach). O(rows) in numpy, once a day."""
        import numpy as np
        import pyarrow as pa

        history, touched = self._history, self._customers
        if history is None and not touched:
            return
        empty = np.zeros(0, dtype=np.int64)
        n_old = len(history.keys) if history is not None else 0
        a, b = (
            (history.starts[:-1].copy(), history.starts[1:].copy()) if history is not None else (empty, empty)
        )
        extra = [c for key, c in touched.items() if history is None or key not in history.code_of]
        keys = (history.keys if history is not None else []) + [c.key for c in extra]
        tails: list[tuple[int, _Customer]] = [(n_old + k, c) for k, c in enumerate(extra)]
        for c in touched.values():
            if c.history is not None and c.history is history:
                a[c.code], b[c.code] = c.a, c.b
                tails.append((c.code, c))
        tails.sort(key=lambda item: item[0])
        n = len(keys)
        base_len = np.zeros(n, dtype=np.int64)
        base_len[:n_old] = b - a
        tail_codes = np.array([code for code, _ in tails], dtype=np.int64)
        tail_len = np.zeros(n, dtype=np.int64)
        tail_len[tail_codes] = [len(c.us) for _, c in tails]
        total_len = base_len + tail_len
        new_start = np.cumsum(total_len) - total_len
        rows = int(total_len.sum())

        def spread(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
            """Per row: its group's start plus its position within the group."""
            offsets = np.cumsum(lengths) - lengths
            within = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(offsets, lengths)
            return np.repeat(starts, lengths) + within

        old_len = base_len[:n_old]
        source = spread(a, old_len)  # the history's rows kept, customer by customer
        where_old = spread(new_start[:n_old], old_len)  # where they go
        where_new = spread(new_start[tail_codes] + base_len[tail_codes], tail_len[tail_codes])

        def column(name: str, tail_arrays: list[array], dtype: type) -> np.ndarray:
            out: np.ndarray = np.empty(rows, dtype=dtype)
            if history is not None:
                out[where_old] = getattr(history, name)[source]
            if len(where_new):
                out[where_new] = np.concatenate([np.frombuffer(t, dtype=dtype) for t in tail_arrays])
            return out

        columns = {
            "us": column("us", [c.us for _, c in tails], np.int64),
            "usd": column("usd", [c.usd for _, c in tails], np.float64),
            "flags": column("flags", [c.foreign for _, c in tails], np.int8),
            "arrival": column("arrival", [c.arrival for _, c in tails], np.int32),
            "merchant": column("merchant", [c.merchant for _, c in tails], np.int32),
        }
        tail_ids = pa.array([tid for _, c in tails for tid in c.ids], pa.large_string())
        hashes = np.empty(rows, dtype=np.uint64)
        # The ids known: the history's window rows and the tails'; id_index: each row's, or -1.
        id_index = np.full(rows, -1, dtype=np.int64)
        if history is not None:
            hashes[where_old] = history.hashes[source]
            code = np.repeat(np.arange(n_old), old_len)
            known = source >= history.window_start[code]
            window_rows = history.window_base[code[known]] + source[known] - history.window_start[code[known]]
            known_ids = pa.concat_arrays([history.window_ids.array.take(pa.array(window_rows)), tail_ids])
            id_index[where_old[known]] = np.arange(len(window_rows))
            id_index[where_new] = len(window_rows) + np.arange(len(where_new))
        else:
            known_ids = tail_ids
            id_index[where_new] = np.arange(len(where_new))
        hashes[where_new] = _id_hashes(tail_ids)
        columns["hashes"] = hashes
        # Bit 1 again wherever the ids are known (a tail's rows may share a millisecond with the window's).
        code = np.repeat(np.arange(n), total_len)
        at = np.flatnonzero(id_index >= 0)
        first = _History.first_in_millisecond(
            code[at], columns["us"][at], known_ids.take(pa.array(id_index[at]))
        )
        columns["flags"][at] = (columns["flags"][at] & 1) | np.where(first, 0, 2).astype(np.int8)

        ms = columns["us"] // US_PER_MS
        last_ms = np.zeros(n, dtype=np.int64)
        nonempty = total_len > 0
        last_ms[nonempty] = ms[(new_start + total_len - 1)[nonempty]]
        silent = last_ms <= self._now_ms - self._retain_ms
        recent = columns["arrival"] >= self._now_ms // DAY_MS - self._id_reach_days
        keep = recent | (~silent[code] & (ms > last_ms[code] - self._retain_ms))
        lengths = np.bincount(code[keep], minlength=n)
        present = np.flatnonzero(lengths)
        starts = np.zeros(len(present) + 1, dtype=np.int64)
        np.cumsum(lengths[present], out=starts[1:])
        kept = {name: values[keep] for name, values in columns.items()}
        window_start = _window_start(starts, kept["us"], self._lateness_us)
        in_window = np.arange(len(kept["us"])) >= np.repeat(window_start, lengths[present])
        window_index = id_index[keep][in_window]
        if (window_index < 0).any():  # an observed transaction further back than the lateness allows
            raise RuntimeError("the live state's compaction lost the ids of a customer's window")
        self._history = _History(
            [keys[c] for c in present.tolist()],
            lengths[present],
            kept,
            window_start,
            known_ids.take(pa.array(window_index)),
        )
        self._customers = {}
        self._copies = {}
        self._view = self._recent_id = None  # both hold the old history, which must go now


def memory_returnable() -> bool:
    """Whether Arrow allocates from the C library, which `release_freed_memory` can give back to the system.
    Its default, mimalloc, keeps what a load freed (about as much again as the state, by `benchmarks.serving
    --state-footprint`). Arrow reads ARROW_DEFAULT_MEMORY_POOL once, when it loads: `mlops serve` sets it to
    "system" before anything imports pyarrow."""
    import pyarrow as pa

    return pa.default_memory_pool().backend_name == "system"


def map_large_allocations() -> None:
    """Have glibc serve every allocation of a mebibyte or more by its own mapping, returned to the system
    when freed: by default the threshold grows (up to 32 MiB) after such a free, and the load's numpy
    temporaries below it then stay in the heap until `release_freed_memory`. Linux (glibc) only; once per
    process, before a load."""
    import ctypes
    import ctypes.util

    libc = ctypes.util.find_library("c")
    if libc is not None and hasattr(ctypes.CDLL(libc), "mallopt"):
        ctypes.CDLL(libc).mallopt(_M_MMAP_THRESHOLD, 1 << 20)


_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def release_freed_memory() -> None:
    """Give the memory a load freed back to the system: Arrow's pool keeps what it freed, and glibc keeps
    large freed blocks once its mmap threshold has grown (numpy's temporaries). Without it the process
    stays at the load's peak. Linux (glibc) only for the second; elsewhere Arrow's part alone."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")  # malloc_trim: glibc only
    if libc is not None and hasattr(ctypes.CDLL(libc), "malloc_trim"):
        ctypes.CDLL(libc).malloc_trim(0)


def _arrivals(root: Path) -> list[date]:
    prefix = "arrival_date="
    if not root.is_dir():
        return []
    return sorted(
        date.fromisoformat(p.name.removeprefix(prefix))
        for p in root.iterdir()
        if p.is_dir() and p.name.startswith(prefix)
    )


def _silver(root: Path):
    """A silver table's files as one Arrow dataset (hive partitions by arrival date)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(pa.schema([("arrival_date", pa.date32())]), flavor="hive")
    return ds.dataset(root, format="parquet", partitioning=partitioning)


def _since(first: date, before: tuple[str, datetime] | None = None):
    """The filter: arrivals on or after `first` and, with `before`, its column earlier than its time."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    condition = ds.field("arrival_date") >= pa.scalar(first, pa.date32())
    if before is not None:
        column, when = before
        condition &= ds.field(column) < pa.scalar(when, pa.timestamp("us", tz="UTC"))
    return condition


def _read(
    root: Path, columns: list[str], first: date, before: tuple[str, datetime] | None = None, where=None
) -> pa.Table:
    """A silver table's `columns` from the arrivals on or after `first` (hive partitions, by Arrow)."""
    import pyarrow as pa

    if not root.is_dir():
        return pa.table({c: pa.array([], pa.string()) for c in columns})
    condition = _since(first, before)
    if where is not None:
        condition &= where
    return _silver(root).to_table(columns=columns, filter=condition)


def _fragments(root: Path, first: date, before: tuple[str, datetime]):
    """(the files of a silver table in the arrivals on or after `first`, the filter that also keeps rows
    with `before`'s column earlier than its time, the dataset's schema)."""
    condition = _since(first, before)
    if not root.is_dir():
        return [], condition, None
    dataset = _silver(root)
    return list(dataset.get_fragments(filter=condition)), condition, dataset.schema


def _ids_at(fragments: list, condition, schema, sizes: list[int], positions: np.ndarray) -> pa.Array:
    """The transaction ids of the rows at `positions` (in the order of the files and, within each, of the
    rows `condition` keeps: `sizes` rows each), in the order of `positions`."""
    import numpy as np
    import pyarrow as pa

    by_position = np.argsort(positions, kind="stable")
    wanted = positions[by_position]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    chunks = []
    for k, fragment in enumerate(fragments):
        lo, hi = np.searchsorted(wanted, [offsets[k], offsets[k + 1]])
        if lo == hi:
            continue
        ids = fragment.to_table(schema=schema, columns=["transaction_id"], filter=condition)["transaction_id"]
        if len(ids) != sizes[k]:
            raise RuntimeError(
                f"{fragment.path} changed while the live state loaded from it: restart the load"
            )
        chunks.append(ids.take(pa.array(wanted[lo:hi] - offsets[k])).combine_chunks().cast(pa.large_string()))
    ids = pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_string())
    back = np.empty_like(by_position)
    back[by_position] = np.arange(len(by_position))
    return ids.take(pa.array(back))


def _codes(files: list[tuple[pa.Array, np.ndarray]]) -> tuple[list[str], list[np.ndarray]]:
    """(the distinct values of all files, each file's rows as codes into them), from each file's
    dictionary encoding (its distinct values, its rows' indices into them): one encoding of the files'
    dictionaries together gives each file's values their codes."""
    import numpy as np
    import pyarrow as pa

    dictionaries = [dictionary for dictionary, _ in files]
    encoded = pa.concat_arrays(dictionaries).dictionary_encode()
    codes_of_values = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    offsets = np.cumsum([0] + [len(dictionary) for dictionary in dictionaries]).tolist()
    codes = [codes_of_values[offsets[k] : offsets[k + 1]][indices] for k, (_, indices) in enumerate(files)]
    return encoded.dictionary.to_pylist(), codes


def _at_least(values: np.ndarray | None, bounds: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row: whether its value (its position, for None) is at least its group's bound, the rows grouped
    in order, `lengths` of them a group. In slices of a million rows, so that the bounds are never
    repeated for every row at once (the load's peak)."""
    import numpy as np

    total = int(lengths.sum())
    out = np.empty(total, dtype=bool)
    ends = np.cumsum(lengths)
    for lo in range(0, total, _SLICE_ROWS):
        hi = min(lo + _SLICE_ROWS, total)
        groups = np.arange(
            np.searchsorted(ends, lo, side="right"), np.searchsorted(ends, hi - 1, side="right") + 1
        )
        counts = np.minimum(ends[groups], hi) - np.maximum(ends[groups] - lengths[groups], lo)
        here = np.arange(lo, hi) if values is None else values[lo:hi]
        out[lo:hi] = here >= np.repeat(bounds[groups], counts)
    return out


def _sort(first: np.ndarray, then: np.ndarray) -> np.ndarray:
    """Row order by (first, then), ties in row order (numpy's lexsort is stable: faster here than Arrow's
    sort of a two-column table, and it allocates only the order)."""
    import numpy as np

    return np.lexsort((then, first))


def _count(root: Path, first: date, before: tuple[str, datetime]) -> int:
    """The rows `_read` would read from the arrivals on or after `first`, counted from the files' metadata
    and the filter (no column is materialised)."""
    if not root.is_dir():
        return 0
    return _silver(root).count_rows(filter=_since(first, before))
