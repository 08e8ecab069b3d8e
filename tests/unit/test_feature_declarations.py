"""One declaration per gold feature (pipelines/gold/contract.py FEATURES): a declaration that names an unknown
input, aggregation, window or type is refused naming the feature; the live state (features/live.py) fills
each row by what a feature computes, so a reordered declaration moves no value to another name and a
declared feature the live state cannot compute fails naming it instead of serving a guess."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from features import live
from features.definitions import INTEGER_FEATURES
from features.live import LiveState
from pipelines.gold.contract import CUSTOMER_FEATURES, FEATURES, MERCHANT_FEATURES, Feature

pytestmark = pytest.mark.unit
T0 = datetime(2026, 3, 1, 12, tzinfo=UTC)


def _rows() -> tuple[dict, dict]:
    state = LiveState(late_event_days=1)
    base = {"customer_id": "c001", "merchant_id": "m1", "currency": "EUR", "country": "DE"}
    for n, (minutes, amount) in enumerate(((0, 10.0), (30, 25.5), (200, 7.25))):
        txn = {**base, "transaction_id": f"tx{n:012x}", "amount": amount}
        txn["event_timestamp"] = T0 + timedelta(minutes=minutes)
        customer, merchant = state.observe(txn)
    return customer, merchant


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"input": "amount_eur"}, "input 'amount_eur'"),
        ({"aggregation": "median"}, "aggregation 'median'"),
        ({"window": "2h"}, "window '2h'"),
        ({"window": None}, "window None"),
        ({"dtype": "int32"}, "dtype 'int32'"),
        ({"entity": "device"}, "entity 'device'"),
        ({"name": "merchant_txn_count_1h"}, "starts with its entity"),
    ],
)
def test_a_declaration_with_an_unknown_part_is_refused_naming_the_feature(change, named):
    declared = {
        "name": "customer_txn_count_1h",
        "entity": "customer",
        "input": "transaction",
        "aggregation": "count",
        "window": "1h",
        "dtype": "int64",
        "description": "d",
    }
    with pytest.raises(ValueError, match=named) as refused:
        Feature(**(declared | change))
    assert repr((declared | change)["name"]) in str(refused.value)


def test_the_contract_feast_types_and_live_rows_follow_the_declarations():
    assert tuple(f.name for f in FEATURES if f.entity == "customer") == CUSTOMER_FEATURES
    assert tuple(f.name for f in FEATURES if f.entity == "merchant") == MERCHANT_FEATURES
    assert {f.name for f in FEATURES if f.dtype == "int64"} == INTEGER_FEATURES
    customer, merchant = _rows()
    assert set(customer) - {"customer_id", "event_timestamp"} == set(CUSTOMER_FEATURES)
    assert set(merchant) - {"merchant_id", "event_timestamp"} == set(MERCHANT_FEATURES)
    # the third transaction: 200 minutes after the first, 170 after the second
    assert customer["customer_txn_count_1h"] == 1 and customer["customer_txn_count_24h"] == 3
    assert customer["customer_seconds_since_previous"] == 170 * 60.0
    assert merchant["merchant_txn_count_24h"] == 3


def test_a_reordered_declaration_moves_no_value_to_another_name(monkeypatch):
    before_customer, before_merchant = _rows()
    monkeypatch.setattr(live, "_CUSTOMER_DECLARED", tuple(reversed(live._CUSTOMER_DECLARED)))
    monkeypatch.setattr(live, "_MERCHANT_DECLARED", tuple(reversed(live._MERCHANT_DECLARED)))
    after_customer, after_merchant = _rows()
    assert after_customer == before_customer and after_merchant == before_merchant
    assert list(after_customer) != list(before_customer)  # the order did change


def test_a_declared_feature_the_live_state_cannot_compute_fails_naming_it(monkeypatch):
    new = Feature(
        "customer_amount_sum_never", "customer", "amount_usd", "distinct_count", "7d", "int64", "new"
    )
    monkeypatch.setattr(live, "_CUSTOMER_DECLARED", (*live._CUSTOMER_DECLARED, (new.name, new.key)))
    with pytest.raises(
        ValueError, match="'customer_amount_sum_never' \\(distinct_count of amount_usd over 7d\\)"
    ):
        _rows()


def test_the_gold_suites_check_every_declared_feature_by_its_aggregation():
    from pipelines.suites import build_suite

    for entity in ("customer", "merchant"):
        checks = {
            (e["type"], e["kwargs"].get("column"))
            for e in build_suite(f"gold_{entity}_features")["expectations"]
        }
        for f in FEATURES:
            if f.entity != entity:
                continue
            assert ("expect_column_values_to_be_between", f.name) in checks, f.name
            nullable = f.aggregation in ("std", "time_since_previous")
            assert (("expect_column_values_to_not_be_null", f.name) in checks) is not nullable, f.name
    pairs = [
        e["kwargs"]
        for e in build_suite("gold_customer_features")["expectations"]
        if e["type"] == "expect_column_pair_values_a_to_be_greater_than_b"
    ]
    assert [(p["column_A"], p["column_B"]) for p in pairs] == [
        ("customer_txn_count_24h", "customer_txn_count_1h"),
        ("customer_txn_count_7d", "customer_txn_count_24h"),
        ("customer_txn_count_30d", "customer_txn_count_7d"),
    ]
