"""What a date carries into the next (training/feature_rows.py) lets the point-in-time join of each date see
exactly what the join over every gold row sees: random gold rows and queries crowded around midnight (the
lag before a day's first transaction reaches into the day before), ties on event and created time, and a
short TTL, on tiny inline tables, against features.offline.match_latest over all of gold."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from features.offline import match_latest
from pipelines.gold.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP
from training.dataset import FEATURE_LAG
from training.feature_rows import View, _carry, _empty_carry

FIRST = date(2026, 3, 1)
DAYS = [FIRST + timedelta(days=k) for k in range(6)]
KEYS = [f"k{i}" for i in range(40)]
MS = 1_000  # microseconds
DAY_US = 86_400_000_000


def _day_start_us(day: date) -> int:
    return int(datetime.combine(day, datetime.min.time(), tzinfo=UTC).timestamp()) * 1_000_000


def _times(rng: np.random.Generator, day: date, n: int) -> np.ndarray:
    """Times of `day` in microseconds, half of them within 3 ms of either midnight."""
    start = _day_start_us(day)
    near = rng.integers(0, 3 * MS, size=n)
    edges = np.where(rng.random(n) < 0.5, start + near, start + DAY_US - 1 - near)
    spread = start + rng.integers(0, DAY_US, size=n)
    times = np.where(rng.random(n) < 0.5, edges, spread)
    times[: n // 5] = times[n // 5 : 2 * (n // 5)]  # some rows share their event time with another
    return times


def _gold(rng: np.random.Generator, day: date, n: int, first_id: int) -> pa.Table:
    ts = pa.timestamp("us", tz="UTC")
    times = _times(rng, day, n)
    created = np.where(rng.random(n) < 0.5, times, times + rng.integers(0, 2, size=n))
    return pa.table(
        {
            "k": pa.array(rng.choice(KEYS, size=n), pa.string()),
            EVENT_TIMESTAMP: pa.array(times, pa.int64()).cast(ts),
            CREATED_TIMESTAMP: pa.array(created, pa.int64()).cast(ts),
            "f": pa.array(np.arange(first_id, first_id + n), pa.float64()),  # which row matched
        }
    )


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("ttl", [timedelta(days=2), timedelta(hours=30)])
def test_each_date_sees_through_its_carry_what_the_whole_join_sees(seed, ttl):
    rng = np.random.default_rng(seed)
    view = View("v", "t", "k", ttl, ("f",))
    golds = [_gold(rng, d, 60 if k != 2 else 0, 1000 * k) for k, d in enumerate(DAYS)]  # day 3: no gold
    everything = pa.concat_tables(golds)
    carried = _empty_carry(view)
    expired = 0
    for day, gold in zip(DAYS, golds, strict=True):
        # Each transaction asks for the state just before it.
        query_ns = _times(rng, day, 80) * 1000 - FEATURE_LAG // timedelta(microseconds=1) * 1000
        keys = pa.array(rng.choice(KEYS, size=80), pa.string())
        expected = match_latest(everything, "k", keys, query_ns, ttl)["f"].to_pylist()
        seen = match_latest(pa.concat_tables([carried, gold]), "k", keys, query_ns, ttl)["f"].to_pylist()
        assert seen == expected, day
        forever = match_latest(everything, "k", keys, query_ns, timedelta(days=365))["f"].to_pylist()
        expired += sum(e is None and f is not None for e, f in zip(expected, forever, strict=True))
        carried = _carry(view, carried, gold if gold.num_rows else None, day, FEATURE_LAG)
        # Only each entity's latest row before the next day's lag, plus the rows after it, is carried.
        boundary = _day_start_us(day + timedelta(days=1)) - FEATURE_LAG // timedelta(microseconds=1)
        before = carried.filter(pc.less_equal(carried[EVENT_TIMESTAMP].cast(pa.int64()), boundary))
        assert before.num_rows == len(set(before["k"].to_pylist()))
    assert expired > 0  # rows older than the TTL were left out of what the dates saw
