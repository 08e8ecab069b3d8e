"""A late transaction inserted into the live state (features/live/) leaves every row as a state built in
event-time order would give it: the merchant's running totals move by its amount without recomputing them
(an insert at a merchant with months of history is no longer O(n) in Python)."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

from features.live import LiveState

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _txns() -> list[dict]:
    rng = random.Random(7)
    out = []
    for n in range(600):
        out.append(
            {
                "transaction_id": f"tx{n:016x}",
                "customer_id": f"c{rng.randrange(40):07d}",
                "merchant_id": f"m{rng.randrange(3):06d}",
                "amount": round(rng.uniform(1, 500), 2),
                "currency": rng.choice(["EUR", "USD", "GBP"]),
                "country": rng.choice(["DE", "US", "GB", None]),
                "event_timestamp": T0 + timedelta(seconds=rng.randrange(0, 20 * 86_400)),
            }
        )
    return out


def test_late_inserts_give_the_rows_and_running_totals_of_a_state_built_in_order():
    txns = _txns()
    in_order = LiveState(late_event_days=1)
    for txn in sorted(txns, key=lambda t: (t["event_timestamp"], t["transaction_id"])):
        in_order.observe(txn)
    # Arrival order: each transaction late by up to 20 hours against the one it follows.
    shuffled = LiveState(late_event_days=1)
    arrival = sorted(
        txns,
        key=lambda t: (
            t["event_timestamp"] + timedelta(hours=random.Random(t["transaction_id"]).uniform(0, 20))
        ),
    )
    for txn in arrival:
        assert shuffled.refusal([txn]) is None
        shuffled.observe(txn)
    for key, merchant in shuffled.merchants.items():
        assert len(merchant.cum) == len(in_order.merchants[key].cum) == len(merchant.us) + 1
        for got, expected in zip(merchant.cum, in_order.merchants[key].cum, strict=True):
            assert math.isclose(got, expected, rel_tol=1e-12, abs_tol=1e-9), key
    for txn in txns:
        _same(shuffled.rows_of(txn["transaction_id"]), in_order.rows_of(txn["transaction_id"]), txn)


def _same(got, expected, txn) -> None:
    """The same rows: counts and times exactly, amounts to rounding (a late insert adds its amount to the
    running totals after it instead of summing them again)."""
    assert got is not None and expected is not None, txn
    for row, want in zip(got, expected, strict=True):
        assert row.keys() == want.keys(), txn
        for name, value in row.items():
            if isinstance(value, float) and isinstance(want[name], float):
                assert math.isclose(value, want[name], rel_tol=1e-12, abs_tol=1e-9), (name, txn)
            else:
                assert value == want[name], (name, txn)
