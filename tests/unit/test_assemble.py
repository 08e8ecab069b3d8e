"""`serving.features.assemble` fills one table in MODEL_INPUTS order a row per entity (cheap for the one
transaction of a typical request); it must give exactly what a column per feature gives: the reference
below builds every input as its own column, as the training set does, and the two are compared on rows
with missing entities, missing features, integer and float features, and a batch of many."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from features.definitions import CUSTOMER_JOIN_KEY, INTEGER_FEATURES, MERCHANT_JOIN_KEY
from model_contract.inputs import CATEGORICAL_VOCAB, MODEL_INPUTS, NUMERIC_FEATURES, transaction_inputs
from pipelines.gold.contract import CUSTOMER_FEATURES, MERCHANT_FEATURES
from serving.features import assemble


def reference(rows, txns):
    """A column per input, filled value by value."""
    n = len(txns)
    columns = dict(
        transaction_inputs(
            np.array([t["amount"] for t in txns], dtype="float64"),
            [t["currency"] for t in txns],
            [t["country"] for t in txns],
            np.array([int(t["event_timestamp"].timestamp() * 1000) for t in txns], dtype="int64"),
            {column: [t[column] for t in txns] for column in CATEGORICAL_VOCAB},
        )
    )
    for name in (*CUSTOMER_FEATURES, *MERCHANT_FEATURES):
        columns[name] = np.full(n, np.nan)
    missing = []
    for i, (customer, merchant) in enumerate(rows):
        gone = []
        for key, row, names in (
            (CUSTOMER_JOIN_KEY, customer, CUSTOMER_FEATURES),
            (MERCHANT_JOIN_KEY, merchant, MERCHANT_FEATURES),
        ):
            if row is None:
                gone.append(key)
                continue
            for name in names:
                value = row.get(name)
                columns[name][i] = np.nan if value is None else value
        missing.append(gone)
    x = np.column_stack([columns[name] for name in MODEL_INPUTS]).astype("float32")

    def plain(value, name):
        if value != value:
            return None
        return int(value) if name in INTEGER_FEATURES else float(value)

    features = [{name: plain(columns[name][i], name) for name in NUMERIC_FEATURES} for i in range(n)]
    return x, features, missing


def _txn(rng: random.Random, n: int) -> dict:
    return {
        "transaction_id": f"tx{n:016x}",
        "amount": round(rng.uniform(0.01, 5000), 2),
        "currency": rng.choice(["EUR", "USD", "GBP", "JPY"]),
        "country": rng.choice(["DE", "US", "GB", "JP", None]),
        "event_timestamp": datetime(2026, 3, 2, tzinfo=UTC)
        + timedelta(milliseconds=rng.randrange(86_400_000)),
        **{column: rng.choice([*vocab, "unknown", None]) for column, vocab in CATEGORICAL_VOCAB.items()},
    }


def _row(rng: random.Random, names) -> dict | None:
    if rng.random() < 0.2:
        return None
    return {
        name: None
        if rng.random() < 0.1
        else rng.randrange(0, 500)
        if name in INTEGER_FEATURES
        else rng.uniform(-1e6, 1e6)
        for name in names
        if rng.random() > 0.05  # a row may lack a feature altogether
    }


@pytest.mark.parametrize("size", [1, 2, 64])
def test_assembled_inputs_and_features_equal_a_column_per_feature(size):
    rng = random.Random(size)
    for _ in range(20):
        txns = [_txn(rng, n) for n in range(size)]
        rows = [(_row(rng, CUSTOMER_FEATURES), _row(rng, MERCHANT_FEATURES)) for _ in range(size)]
        x, features, missing = reference(rows, txns)
        got = assemble(rows, txns)
        assert got.x.dtype == np.float32 and got.x.shape == x.shape
        np.testing.assert_array_equal(got.x, x)
        assert got.missing == missing
        assert len(got.features) == len(features)
        for mine, theirs in zip(got.features, features, strict=True):
            assert mine.keys() == theirs.keys()
            for name, value in theirs.items():
                assert type(mine[name]) is type(value), name
                assert mine[name] == value or (
                    value is not None and math.isnan(value) and math.isnan(mine[name])
                )
