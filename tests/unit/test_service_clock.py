"""The scoring service's clock and the live state's: a caller's times are checked against the service's own
clock (serving/clock.py), and only that clock makes the live state forget (features/live/)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from features.live import LateTransactionError, LiveState
from serving.clock import ServiceClock

T = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def txn(n: int, customer: str, when: datetime, merchant: str = "m000001") -> dict:
    return {
        "transaction_id": f"tx{n:016x}",
        "customer_id": customer,
        "merchant_id": merchant,
        "amount": 10.0 + n,
        "currency": "EUR",
        "country": "DE",
        "event_timestamp": when,
    }


class Fake:
    """A settable wall and monotonic clock, in seconds."""

    def __init__(self, wall: float) -> None:
        self.wall, self.mono = wall, 100.0

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


def test_the_window_is_around_the_machines_clock_and_moves_with_it():
    fake = Fake(T.timestamp())
    clock = ServiceClock(86_100, 300, wall=lambda: fake.wall, monotonic=lambda: fake.mono)
    window = clock.window()
    assert (clock.mode, window.earliest, window.latest) == (
        "wall",
        T - timedelta(seconds=86_100),
        T + timedelta(seconds=300),
    )
    items = [
        {"event_timestamp": T + timedelta(minutes=4)},
        {"event_timestamp": datetime(2099, 1, 1, tzinfo=UTC)},
    ]
    [violation] = clock.outside(items, "event_timestamp", many=True)
    assert (violation.item, violation.field, violation.value) == (
        1,
        "event_timestamp",
        "2099-01-01T00:00:00Z",
    )
    assert violation.rule.startswith("window:") and "2026-03-10T12:05:00Z" in violation.rule
    late = [{"event_timestamp": T - timedelta(days=1)}]
    assert clock.outside(late, "event_timestamp", many=False)[0].item is None
    fake.advance(3600)
    assert clock.outside(items[:1], "event_timestamp", many=True) == []
    assert clock.window().latest == T + timedelta(hours=1, seconds=300)


def test_a_replay_takes_the_day_it_replays_and_no_other():
    day = datetime(2026, 1, 10, tzinfo=UTC)
    fake = Fake(T.timestamp())
    clock = ServiceClock(86_100, 300, replay_from=day, wall=lambda: fake.wall, monotonic=lambda: fake.mono)
    assert clock.mode == "replay" and clock.now() == day
    inside = [{"event_timestamp": day + timedelta(hours=h)} for h in (0, 12, 23)]
    assert clock.outside(inside, "event_timestamp", many=True) == []
    beyond = [{"event_timestamp": day + timedelta(days=1, minutes=6)}, {"event_timestamp": T}]
    assert [v.item for v in clock.outside(beyond, "event_timestamp", many=True)] == [0, 1]
    fake.advance(60)
    assert clock.now() == day + timedelta(seconds=60)  # the machine's pace, from the replayed day's start
    with pytest.raises(ValueError, match="timezone-aware"):
        ServiceClock(0, 0, replay_from=datetime(2026, 1, 10))


def test_a_transaction_dated_ahead_does_not_make_other_entities_state_vanish():
    live = LiveState()
    live.observe(txn(1, "c0000001", T))
    live.observe(txn(2, "c0000002", datetime(2099, 1, 1, tzinfo=UTC), merchant="m000002"))
    customer, merchant = live.state_before("c0000001", "m000001", T + timedelta(hours=1))
    assert customer is not None and merchant is not None
    assert customer["customer_txn_count_24h"] == 1
    # The chargeback feed neither: a report dated ahead moves nothing but its own merchant.
    live.observe_chargeback("tx" + "0" * 15 + "9", datetime(2099, 1, 2, tzinfo=UTC))
    assert live.state_before("c0000001", "m000001", T + timedelta(hours=1))[0] is not None


def test_only_the_services_clock_forgets_what_has_expired():
    live = LiveState()
    live.observe(txn(1, "c0000001", T))
    live.advance(T + timedelta(days=10))
    assert live.kept("c0000001") == 1
    live.advance(T + timedelta(days=live.retain_days + 1))
    assert live.kept("c0000001") == 0
    live.advance(T)  # an earlier time does not move the clock back
    assert live._now_ms == int((T + timedelta(days=live.retain_days + 1)).timestamp() * 1000)


def test_a_transaction_older_than_its_entitys_kept_history_is_refused_before_anything_is_kept():
    live = LiveState(late_event_days=1)
    live.observe(txn(1, "c0000001", T))
    request = [
        txn(2, "c0000003", T - timedelta(hours=1), merchant="m000003"),  # fine on its own
        txn(3, "c0000001", T - timedelta(days=1, minutes=1)),  # more than a day before c0000001's latest
    ]
    index, why = live.refusal(request)
    assert index == 1 and "c0000001" in why and "more than 1 day" in why
    assert live.kept("c0000003") == 0  # nothing of the request was kept
    # Within one request, an earlier item raises what the later ones are checked against.
    ordered = [txn(4, "c0000004", T), txn(5, "c0000004", T - timedelta(days=2))]
    assert live.refusal(ordered)[0] == 1
    assert live.refusal([txn(6, "c0000001", T - timedelta(hours=23))]) is None
    with pytest.raises(LateTransactionError, match="tx0000000000000003"):
        live.observe(request[1])
    # A resend of a kept transaction is no new transaction, however old.
    assert live.refusal([txn(1, "c0000001", T)]) is None


def test_a_resend_is_one_within_the_dedup_lookback_whatever_the_clock():
    live = LiveState(dedup_lookback_days=30)
    first = live.observe(txn(1, "c0000001", T))
    assert live.observe(txn(1, "c0000001", T)) == first  # a resend: the first copy's rows
    again = txn(1, "c0000001", T + timedelta(days=31))  # the same id past the lookback: silver keeps it
    customer, _ = live.observe(again)
    assert customer["event_timestamp"] == T + timedelta(days=31)
    assert live.kept("c0000001") == 2


def test_a_history_larger_than_the_state_may_hold_is_refused_at_start_with_what_to_do(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.settings import Settings
    from features.live import BYTES_PER_TRANSACTION, StateTooLargeError

    settings = Settings(home=tmp_path / "home")
    rows = 50
    folder = settings.lake / "silver" / "transactions" / "arrival_date=2026-03-09"
    folder.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "transaction_id": [f"tx{n:016x}" for n in range(rows)],
                "customer_id": [f"c{n % 7:07d}" for n in range(rows)],
                "merchant_id": [f"m{n % 3:06d}" for n in range(rows)],
                "amount": pa.array([10.5] * rows, pa.float64()),
                "currency": ["EUR"] * rows,
                "country": ["DE"] * rows,
                "event_timestamp": pa.array(
                    [T - timedelta(days=1, minutes=n) for n in range(rows)], pa.timestamp("us", tz="UTC")
                ),
            }
        ),
        folder / "part-0.parquet",
    )
    with pytest.raises(StateTooLargeError, match=r"50 transactions .* over serving\.max_state_bytes"):
        LiveState.from_lake(settings, T, max_bytes=rows * BYTES_PER_TRANSACTION - 1)
    live = LiveState.from_lake(settings, T, max_bytes=rows * BYTES_PER_TRANSACTION)
    assert live.kept_transactions() == rows
