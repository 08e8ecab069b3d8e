"""The live state's columns: customers' history as one numpy column per field (`History`), each customer's
rows with what was observed since (`Customer`), and each merchant's times and running USD totals
(`Merchant`); each computes its gold rows from the declarations (values.CUSTOMER_PLAN, MERCHANT_PLAN).
Layout and costs: the package's docstring (features/live/__init__.py)."""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from features.definitions import CUSTOMER_JOIN_KEY, MERCHANT_JOIN_KEY
from features.live import values
from features.live.values import (
    DAY_MS,
    US_PER_MS,
    Row,
    aggregate,
    id_hash,
    to_datetime,
    window_firsts,
)
from pipelines.gold.contract import EVENT_TIMESTAMP, LOOKBACK_DAYS, WINDOWS

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

_MONTH_MS = WINDOWS["30d"] * 1_000
# An entity's columns are cut when the expired part is at least this share of them: each cut is O(n), so
# amortised O(1) per transaction, and at most a third more memory than the retained part.
_TRIM_SHARE = 4
_TRIM_MIN = 16


class Ids:
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


class History:
    """Customers' transactions in columns, one row per transaction, each customer's rows together and sorted
    by (event time, transaction_id): what was bootstrapped from the lake, and after each day's compaction
    what was observed since (fold.compact). Per row: time (us), USD amount, flags (bit 0 abroad,
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
        self.window_ids = Ids(window_ids)
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


def window_starts(starts: np.ndarray, us: np.ndarray, lateness_us: int) -> np.ndarray:
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


Columns = tuple[Sequence[int], Sequence[float], Sequence[int], Sequence[int], Sequence[int]]


class Customer:
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

    def __init__(self, key: str, history: History | None = None, code: int = -1) -> None:
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
        self._cached: Columns | None = None

    def __len__(self) -> int:
        return self.b - self.a + len(self.us)

    def clone(self) -> Customer:
        """A copy whose tail can change without changing this one's (the history is shared: nothing changes
        it)."""
        twin = Customer(self.key)
        twin.history, twin.code, twin.a, twin.b = self.history, self.code, self.a, self.b
        twin.us, twin.usd, twin.foreign = array("q", self.us), array("d", self.usd), array("b", self.foreign)
        twin.merchant, twin.arrival = array("i", self.merchant), array("i", self.arrival)
        twin.ids = list(self.ids)
        return twin

    def last_us(self) -> int:
        if self.us:
            return self.us[-1]
        assert self.history is not None
        return int(self.history.us[self.b - 1])

    def columns(self) -> Columns:
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
    ) -> tuple[int, Columns]:
        """Insert a transaction in order: its index, and the columns with it (what `row` reads)."""
        columns: Columns | None = self.columns()
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

    def row_at(self, i: int, columns: Columns | None = None) -> Row:
        """Transaction i's row, a copy of the cached one where it is the last."""
        if i != len(self) - 1:
            return self.row(i, columns)
        if self.latest is None:
            self.latest = self.row(i, columns)
        return dict(self.latest)

    def row(self, i: int, columns: Columns | None = None) -> Row:
        """Gold's customer row of transaction i (transforms.customer_features): windows over whole
        milliseconds, (t - w, t], found by binary search on the microsecond times."""
        times, usd_, foreign, merchants, arrival = columns or self.columns()
        t = times[i] // US_PER_MS
        hi = bisect_left(times, (t + 1) * US_PER_MS)  # every transaction of the same millisecond is inside
        inputs = {"amount_usd": usd_, "is_foreign": foreign, "merchant_id": merchants}
        row: Row = {CUSTOMER_JOIN_KEY: self.key, EVENT_TIMESTAMP: to_datetime(times[i])}
        starts = window_firsts(times, t, hi, values.CUSTOMER_PLAN.windows)
        memo: dict[tuple[str, str], Any] = {}
        for name, feature in values.CUSTOMER_PLAN.features:
            if feature.aggregation == "time_since_previous":
                row[name] = self._seconds_since_previous(i, times, arrival)
            else:
                window = feature.window or ""
                lo = starts[window]
                in_window = inputs[feature.input][lo:hi] if feature.input in inputs else ()
                row[name] = aggregate(feature, in_window, hi - lo, memo, window)
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


class Merchant:
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

    def remove(self, us: int, amount: float) -> bool:
        """Take a kept transaction at `us` of `amount` USD out (an erased customer's: LiveState.forget): every
        running total after it falls by its amount. Of several at that time any one goes, as their rows are
        the same. False when none is kept there (trimmed away)."""
        import numpy as np

        i = self.position(us)
        if i < 0:
            return False
        self.latest = None
        del self.us[i]
        view = np.frombuffer(self.cum, dtype=np.float64)
        view[i + 2 :] -= amount
        del view  # an array may shrink only once no view of it is left
        del self.cum[i + 1]
        return True

    def drop_chargeback(self, label_ms: int) -> bool:
        """Take one attributed chargeback reported at `label_ms` back; False when none is kept there."""
        i = bisect_left(self.chargebacks, label_ms)
        if i == len(self.chargebacks) or self.chargebacks[i] != label_ms:
            return False
        del self.chargebacks[i]
        self.latest = None
        return True

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
        starts = window_firsts(times, t, hi, values.MERCHANT_PLAN.windows)
        row: Row = {MERCHANT_JOIN_KEY: self.key, EVENT_TIMESTAMP: to_datetime(times[i])}
        for name, feature in values.MERCHANT_PLAN.features:
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
