"""One declaration per gold feature (pipelines/gold/contract.py FEATURES): a declaration that names an unknown
input, aggregation, window or type, or one gold cannot compute, is refused naming the feature; the live
state (features/live/) computes each row from the declarations, so a reordered declaration moves no value
to another name, a new declaration is served with no other change, and a declared feature the live state
keeps no values for is refused when it starts instead of serving a guess."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from features.definitions import INTEGER_FEATURES
from features.live import LiveState, values
from mlops.feature_catalog import live_problems
from pipelines.contracts import CURRENCY_PER_USD
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


def _declare(monkeypatch, entity: str, declared) -> None:
    supported = values.CUSTOMER_SUPPORTED if entity == "customer" else values.MERCHANT_SUPPORTED
    monkeypatch.setattr(values, f"{entity.upper()}_PLAN", values.Plan(entity, tuple(declared), supported))


def test_a_reordered_declaration_moves_no_value_to_another_name(monkeypatch):
    before_customer, before_merchant = _rows()
    for entity in ("customer", "merchant"):
        _declare(monkeypatch, entity, reversed([f for f in FEATURES if f.entity == entity]))
    after_customer, after_merchant = _rows()
    assert after_customer == before_customer and after_merchant == before_merchant
    assert list(after_customer) != list(before_customer)  # the order did change


@pytest.mark.parametrize(
    ("feature", "expected"),
    [
        pytest.param(
            Feature("customer_max_amount_24h", "customer", "amount_usd", "max", "24h", "float64", "new"),
            25.5 / CURRENCY_PER_USD["EUR"],
            id="the customer's largest amount in 24h",
        ),
        pytest.param(
            Feature("customer_foreign_share_1h", "customer", "is_foreign", "share", "1h", "float64", "new"),
            0.0,
            id="a share over a sliding window",
        ),
        pytest.param(
            Feature("merchant_amount_mean_7d", "merchant", "amount_usd", "mean", "7d", "float64", "new"),
            (10.0 + 25.5 + 7.25) / 3 / CURRENCY_PER_USD["EUR"],
            id="the merchant's mean amount in 7d",
        ),
    ],
)
def test_a_new_declaration_is_served_without_another_change(monkeypatch, feature, expected):
    """The live state computes a declared feature by its aggregation: declaring it is the whole change."""
    _declare(monkeypatch, feature.entity, (*(f for f in FEATURES if f.entity == feature.entity), feature))
    customer, merchant = _rows()
    row = customer if feature.entity == "customer" else merchant
    assert row[feature.name] == pytest.approx(expected, rel=1e-12)


def test_a_declared_feature_the_live_state_cannot_compute_is_refused_at_start_naming_it(monkeypatch):
    new = Feature("merchant_amount_std_7d", "merchant", "amount_usd", "std", "7d", "float64", "new")
    assert live_problems() == []
    _declare(monkeypatch, "merchant", (*(f for f in FEATURES if f.entity == "merchant"), new))
    with pytest.raises(ValueError, match="merchant_amount_std_7d \\(std of amount_usd over 7d\\)"):
        LiveState(late_event_days=1)
    # and `mlops features check` says so before a deploy
    [problem] = live_problems()
    assert "merchant_amount_std_7d (std of amount_usd over 7d)" in problem and "features/live" in problem


@pytest.mark.parametrize(
    ("declared", "named"),
    [
        pytest.param(("customer_amount_max_7d", "customer", "amount_usd", "max", "7d"), "cannot be merged",
                     id="max over a running window"),
        pytest.param(("customer_distinct_x_24h", "customer", "transaction", "distinct_count", "24h"),
                     "needs a column", id="distinct count of the transaction"),
        pytest.param(("customer_chargebacks_30d", "customer", "chargeback", "count", "30d"),
                     "attributed to the merchant", id="a reported input of the customer"),
        pytest.param(("merchant_count_1h", "merchant", "transaction", "count", "1h"), "not whole days",
                     id="a merchant window that is not whole days"),
    ],
)  # fmt: skip
def test_a_declaration_gold_cannot_compute_is_refused_saying_why(declared, named):
    name, entity, input_, aggregation, window = declared
    with pytest.raises(ValueError, match=named) as refused:
        Feature(name, entity, input_, aggregation, window, "float64", "d")
    assert repr(name) in str(refused.value)


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


def test_every_aggregation_has_its_gold_bounds():
    from pipelines.gold.contract import AGGREGATIONS
    from pipelines.suites import _GOLD_BOUNDS

    assert set(_GOLD_BOUNDS) == set(AGGREGATIONS)


def test_removing_a_feature_a_served_version_takes_is_refused_naming_the_versions():
    from mlops.feature_catalog import Version, removal_problems
    from model_contract.inputs import MODEL_INPUTS

    gone = CUSTOMER_FEATURES[2]
    built = tuple(n for n in MODEL_INPUTS if n != gone)
    versions = [
        Version("4", built, "shadow"),  # trained without it: fine
        Version("3", MODEL_INPUTS, "champion"),
        Version("2", MODEL_INPUTS, ""),  # neither served nor shadowed: may lose it
        Version("1", None, ""),
    ]
    problems = removal_problems(versions, built)
    assert len(problems) == 1 and problems[0].startswith(f"v3 (champion) takes {gone}, which"), problems
    assert removal_problems(versions, MODEL_INPUTS) == []


def test_a_deprecated_feature_stays_built_but_a_new_version_is_not_trained_on_it():
    from dataclasses import replace

    from model_contract.inputs import MODEL_INPUTS, ModelInputError, numeric_width, training_inputs
    from pipelines.gold.contract import _deprecate
    from training.model import FraudMLP, ModelConfig

    old = CUSTOMER_FEATURES[5]
    marked = _deprecate(FEATURES, {old: "replaced by customer_amount_mean_24h"})
    assert [f.name for f in marked] == [f.name for f in FEATURES], "still declared, in place: gold keeps it"
    assert [f.deprecated for f in marked if f.deprecated] == ["replaced by customer_amount_mean_24h"]
    assert all(replace(f, deprecated="") == g for f, g in zip(marked, FEATURES, strict=True))
    inputs = training_inputs(MODEL_INPUTS, [f.name for f in marked if f.deprecated])
    assert old in MODEL_INPUTS and old not in inputs and len(inputs) == len(MODEL_INPUTS) - 1
    assert [n for n in MODEL_INPUTS if n != old] == list(inputs), "the rest in the built order"
    model = FraudMLP(ModelConfig(numeric=numeric_width(inputs), inputs=inputs))
    assert model.mean.shape[0] == numeric_width(MODEL_INPUTS) - 1

    with pytest.raises(ValueError, match=r"customer_gone.*does not declare"):
        _deprecate(FEATURES, {"customer_gone": "why"})
    with pytest.raises(ValueError, match="say why"):
        _deprecate(FEATURES, {old: " "})
    with pytest.raises(ModelInputError, match="categorical codes"):
        numeric_width(("channel_code", *inputs))


def test_features_check_says_whether_a_deprecated_feature_may_be_removed_yet():
    from dataclasses import replace

    from mlops.feature_catalog import Entry, Version, deprecation_status, removal_problems
    from model_contract.inputs import MODEL_INPUTS
    from pipelines.gold.contract import FEATURE_BY_NAME

    old = CUSTOMER_FEATURES[5]
    feature = replace(FEATURE_BY_NAME[old], deprecated="replaced by customer_amount_mean_24h")
    without = tuple(n for n in MODEL_INPUTS if n != old)
    champion_takes_it = [Version("2", without, "shadow"), Version("1", MODEL_INPUTS, "champion")]
    entry = Entry(feature, "customer_features", [v for v in champion_takes_it if old in v.inputs])
    (line,) = deprecation_status([entry, Entry(FEATURE_BY_NAME[CUSTOMER_FEATURES[0]], "customer_features")])
    assert line.startswith(f"{old} is deprecated (replaced by") and "still taken by v1 (champion)" in line
    # removing it now is refused with the version named; once v2 is promoted it may go
    assert any(
        p.startswith(f"v1 (champion) takes {old}") for p in removal_problems(champion_takes_it, without)
    )
    promoted = [Version("2", without, "champion"), Version("1", MODEL_INPUTS, "")]
    (line,) = deprecation_status([Entry(feature, "customer_features", promoted[1:])])
    assert "no version in use takes it: its declaration can be removed" in line
    assert removal_problems(promoted, without) == []


def test_a_declaration_that_needs_another_per_day_state_changes_the_states_format(monkeypatch):
    """Gold's per-day states follow the declarations: the merchant's share abroad over 7 days needs the
    sum of the abroad flag per merchant and day, a state the merchant did not keep; its table gains the
    column and the states' format changes, so every arrival's states are derived again."""
    from pipelines.gold import transforms

    before = transforms.daily_schema("merchant")
    assert before == "merchant_id string, event_date date, n long, usd_sum double"
    share = Feature("merchant_foreign_share_7d", "merchant", "is_foreign", "share", "7d", "float64", "new")
    declared = {e: tuple(f for f in FEATURES if f.entity == e) for e in ("customer", "merchant")}
    declared["merchant"] += (share,)
    monkeypatch.setattr(transforms, "features_of", declared.__getitem__)
    assert transforms.daily_parts("merchant")[-1] == ("is_foreign", "sum")
    assert transforms.daily_schema("merchant") == f"{before}, foreign_n double"
    assert transforms.daily_schema("customer") == (
        "customer_id string, event_date date, n long, usd_sum double, usd_sumsq double, foreign_n double, "
        "last_ms long"
    )  # the tables' columns before the states were generated: their bytes


def test_the_holdout_gives_each_version_its_own_inputs_by_name():
    import numpy as np
    import pandas as pd

    from model_contract.inputs import MissingInputsError
    from training.dataset import Holdout

    x = np.arange(12, dtype="float32").reshape(4, 3)
    extra = pd.DataFrame({"d": [10.0, 11.0, 12.0, 13.0]})
    holdout = Holdout(
        "rev", x, np.zeros(4), None, ("a", "b", "c"), lambda names: extra[[n for n in names if n in extra]]
    )
    assert holdout.matrix(("a", "b", "c")) is x
    np.testing.assert_array_equal(holdout.matrix(("c", "a")), x[:, [2, 0]])
    np.testing.assert_array_equal(holdout.matrix(("b", "d")), np.column_stack([x[:, 1], extra["d"]]))
    with pytest.raises(MissingInputsError, match="does not carry: e") as refused:
        holdout.matrix(("a", "e"), who="champion v1")
    assert refused.value.missing == ("e",) and str(refused.value).startswith("champion v1 takes")
