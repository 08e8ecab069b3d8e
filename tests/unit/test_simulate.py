from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pytest

from pipelines.synthetic.simulate import (
    CARD_LIMIT,
    MAX_LABEL_DELAY_DAYS,
    MS_PER_DAY,
    _cumsum_by_group,
    chargebacks_of_day,
    day_start_ms,
    rows_for_day,
    simulate_day,
    transaction_ids,
    transaction_keys,
)
from pipelines.synthetic.world import build_world

DAY = date(2026, 1, 7)


@pytest.fixture(scope="module")
def world():
    return build_world(seed=3, customers=500, merchants=120)


def _day(world, rows, max_batch=200_000):
    batches = list(simulate_day(world, DAY, rows, seed=3, max_batch=max_batch))
    return batches, {
        f: np.concatenate([getattr(b, f) for b in batches]) for f in batches[0].__dataclass_fields__
    }


def test_a_day_has_exactly_its_rows_in_time_order_within_the_day(world):
    batches, day = _day(world, 5000, max_batch=700)
    assert sum(len(b) for b in batches) == 5000
    assert max(len(b) for b in batches) <= 700  # streamed: never more than one batch in hand
    assert np.all(np.diff(day["event_ms"]) >= 0)
    start = day_start_ms(DAY)
    assert day["event_ms"].min() >= start and day["event_ms"].max() < start + MS_PER_DAY
    assert len(np.unique(day["key"])) == 5000
    assert day["amount"].min() > 0.0 and day["amount"].max() <= CARD_LIMIT


def test_fraud_is_rare_but_present_and_comes_in_bursts(world):
    _, day = _day(world, 20_000)
    rate = day["is_fraud"].mean()
    assert 0.004 < rate < 0.015
    fraud_customers = day["customer"][day["is_fraud"]]
    assert len(np.unique(fraud_customers)) < len(fraud_customers)  # several transactions per compromised card


def test_chargebacks_come_after_their_transaction_and_within_the_delay_bound(world):
    _, day = _day(world, 20_000)
    keys, label_ms = chargebacks_of_day(world, DAY, 20_000, seed=3)
    position = {k: i for i, k in enumerate(day["key"].tolist())}
    rows = np.array([position[k] for k in keys.tolist()])
    event = day["event_ms"][rows]
    assert np.all(label_ms > event)
    assert np.all(label_ms - event <= (MAX_LABEL_DELAY_DAYS + 1) * MS_PER_DAY)
    reported_fraud = day["is_fraud"][rows].mean()
    assert reported_fraud > 0.8  # most chargebacks are real fraud, a few are friendly fraud
    assert np.array_equal(np.sort(keys), np.sort(day["key"][day["label_ms"] >= 0]))


def test_the_same_day_is_the_same_whatever_else_is_generated(world):
    _, first = _day(world, 3000)
    list(simulate_day(world, DAY + timedelta(days=1), 3000, seed=3))
    _, again = _day(world, 3000)
    for field, values in first.items():
        assert np.array_equal(values, again[field]), field


def test_transaction_ids_are_unique_hex_and_do_not_reveal_order():
    keys = transaction_keys(DAY, 2, np.arange(100_000))
    ids = transaction_ids(keys)
    assert len(set(ids.tolist())) == 100_000
    assert all(len(i) == 18 and i.startswith("tx") and int(i[2:], 16) >= 0 for i in ids[:100].tolist())
    assert not np.all(np.diff(keys.astype(np.float64)) > 0)


def test_rows_per_day_is_the_weekly_average():
    monday = date(2026, 1, 5)
    week = [rows_for_day(10_000, monday + timedelta(days=i)) for i in range(7)]
    assert abs(sum(week) / 7 - 10_000) < 2
    assert week[5] > week[6]  # Saturdays are busier than Sundays


@pytest.mark.parametrize(
    ("values", "groups", "expected"),
    [
        ([1, 2, 3], [0, 0, 0], [1, 3, 6]),
        ([1, 2, 3, 4], [0, 0, 1, 1], [1, 3, 3, 7]),
        ([5], [9], [5]),
        ([], [], []),
    ],
)
def test_cumsum_by_group_restarts_at_each_group(values, groups, expected):
    out = _cumsum_by_group(np.array(values, dtype=np.int64), np.array(groups))
    assert out.tolist() == expected


def test_world_rejects_sizes_that_cannot_hold_a_merchant_per_country():
    with pytest.raises(ValueError, match="merchants"):
        build_world(seed=1, customers=10, merchants=3)
