"""What the live state computes: a transaction's own values (its time, USD amount, "is foreign", the id's
hash) and each declared feature's value from its input's values in its window (`Plan`, `aggregate`), as
gold computes them (pipelines/gold/transforms.py). Nothing here holds state; no code per feature: a
feature is its declaration (pipelines/gold/contract.py FEATURES)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from pipelines.contracts import CURRENCY_PER_USD, HOME_COUNTRIES
from pipelines.gold.contract import WINDOWS, Feature, features_of

if TYPE_CHECKING:
    import pyarrow as pa

DAY_MS = 86_400_000
US_PER_MS = 1_000
# pipelines.gold.state.CHARGEBACK_REACH_DAYS, not imported: that module imports Spark, which a scoring
# process does not load. tests/integration/test_live_features.py checks that the two agree.
CHARGEBACK_REACH_DAYS = 32
FEATURE_LAG_US = 1_000  # the training set joins at event time - 1 ms (training.dataset.FEATURE_LAG)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_HOME = frozenset(f"{country}:{currency}" for country, currency in HOME_COUNTRIES.items())

Row = dict[str, Any]


def micros(when: datetime, what: str) -> int:
    """Epoch microseconds of a tz-aware datetime, exactly (no float)."""
    if not isinstance(when, datetime) or when.utcoffset() is None:
        raise ValueError(
            f"{what} must be a timezone-aware datetime (UTC), got {when!r}; attach the zone, "
            "e.g. datetime.fromisoformat('2026-01-05T12:00:00+00:00')"
        )
    delta = when - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def to_datetime(us: int) -> datetime:
    return EPOCH + timedelta(microseconds=us)


def usd(amount: Any, currency: str) -> float:
    """The amount in US dollars as gold computes it: the exact 2-decimal amount as a double (a float, int,
    Decimal or numeric string: each converts to the double nearest the decimal value, as Spark's cast of
    decimal(12,2) does), divided by the currency's units per dollar."""
    return float(amount) / usd_rate(currency)


def usd_rate(currency: str) -> float:
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
    """64-bit FNV-1a of the id's UTF-8 bytes: the key of the history's id index (`id_hashes` computes the
    same values for a whole column)."""
    h = _FNV_OFFSET
    for byte in transaction_id.encode():
        h = ((h ^ byte) * _FNV_PRIME) & _U64
    return h


def id_hashes(ids: pa.Array):
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


class Plan:
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
            f"the live state of the {entity} (features/live/columns.py) keeps no values to compute "
            f"{', '.join(lacking)}; it computes {computes}"
            if lacking
            else None
        )


# What each entity's live columns can aggregate. A customer keeps every transaction's values (USD amount,
# abroad flag, merchant) for 30 days: any aggregation of them. A merchant keeps its transactions' times and
# running USD totals (16 bytes each: the busiest entities) and its chargebacks' report times.
ANY_AGGREGATION = {"count", "sum", "mean", "std", "share", "per_transaction", "distinct_count", "max"}
CUSTOMER_SUPPORTED = {
    "transaction": {"count", "time_since_previous"},
    "amount_usd": ANY_AGGREGATION,
    "is_foreign": ANY_AGGREGATION,
    "merchant_id": {"distinct_count"},
}
MERCHANT_SUPPORTED = {
    "transaction": {"count"},
    "amount_usd": {"sum", "mean"},
    "chargeback": {"count", "per_transaction"},
}
CUSTOMER_PLAN = Plan("customer", features_of("customer"), CUSTOMER_SUPPORTED)
MERCHANT_PLAN = Plan("merchant", features_of("merchant"), MERCHANT_SUPPORTED)


def window_firsts(times: Sequence[int], t: int, hi: int, windows: Sequence[str]) -> dict[str, int]:
    """Index of the first transaction inside each window (t - w, t] (whole milliseconds), shortest first,
    each search bounded by the previous one's."""
    starts: dict[str, int] = {}
    bound = hi
    for window in windows:
        bound = starts[window] = bisect_left(times, (t - WINDOWS[window] * 1_000 + 1) * US_PER_MS, 0, bound)
    return starts


def aggregate(feature: Feature, values: Sequence[Any], n: int, memo: dict, window: str) -> Any:
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
        memo[key] = (stddev_samp if feature.sliding else stddev_from_sums)(values)
    _n, total, mean, std = memo[key]
    if aggregation == "sum":
        return total
    if aggregation in ("mean", "share", "per_transaction"):
        return mean
    return std


def stddev_samp(values: Sequence[float]) -> tuple[int, float, float, float | None]:
    """(count, sum, mean, Spark's stddev_samp) of a small window: exact per frame (two passes here), as
    gold's sliding frames compute it; null below two values."""
    n = len(values)
    total = sum(values)
    mean = total / n
    if n < 2:
        return n, total, mean, None
    return n, total, mean, math.sqrt(sum([(x - mean) ** 2 for x in values]) / (n - 1))


def stddev_from_sums(values: Sequence[float]) -> tuple[int, float, float, float | None]:
    """(count, sum, mean, std) with gold's formula from sums, negative rounding clamped
    (transforms.customer_features): summed here over the window itself, not as a difference of running
    totals, so that a zero variance stays zero as in gold instead of becoming rounding noise."""
    n = len(values)
    total = sum(values)
    if n < 2:
        return n, total, total / n, None
    variance = (sum([x * x for x in values]) - total * total / n) / (n - 1)
    return n, total, total / n, math.sqrt(max(variance, 0.0))
