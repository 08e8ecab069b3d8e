"""The fraud in the synthetic feed is learnable, but not trivially: a model with behavioural features
clearly beats a naive one and the base rate, and stays clearly below a perfect score."""

from __future__ import annotations

from datetime import date, timedelta

import numpy as np
import pandas as pd
import pytest
from sklearn.ensemble import HistGradientBoostingClassifier
from sklearn.metrics import average_precision_score

from pipelines.synthetic.simulate import rows_for_day, simulate_day
from pipelines.synthetic.world import build_world

ROW_FEATURES = ["log_amount", "foreign", "category", "channel", "hour"]
HISTORY_FEATURES = ["amount_vs_habit", "seconds_since_previous", "count_1h", "known_merchant"]


@pytest.fixture(scope="module")
def transactions() -> pd.DataFrame:
    world = build_world(seed=11, customers=2000, merchants=300)
    frames = []
    for offset in range(21):
        day = date(2026, 1, 1) + timedelta(days=offset)
        for batch in simulate_day(world, day, rows_for_day(4000, day), seed=11):
            frames.append(
                pd.DataFrame(
                    {
                        "event_ms": batch.event_ms,
                        "customer": batch.customer,
                        "merchant": batch.merchant,
                        "amount": batch.amount,
                        "channel": batch.channel,
                        "is_fraud": batch.is_fraud,
                        "day": offset,
                    }
                )
            )
    df = pd.concat(frames, ignore_index=True)
    df["category"] = world.merchant_category[df.merchant]
    df["foreign"] = (world.merchant_country[df.merchant] != world.customer_home[df.customer]).astype(int)
    df["hour"] = (df.event_ms // 3_600_000) % 24
    df["log_amount"] = np.log(df.amount / world.customer_currency_rate[df.customer])
    by_customer = df.groupby("customer")
    df["amount_vs_habit"] = df.log_amount - by_customer.log_amount.transform(
        lambda s: s.shift().expanding().mean()
    )
    df["seconds_since_previous"] = by_customer.event_ms.diff() / 1000
    df["count_1h"] = _count_previous_hour(df)
    df["known_merchant"] = (df.groupby(["customer", "merchant"]).cumcount() > 0).astype(int)
    return df


def _count_previous_hour(df: pd.DataFrame) -> np.ndarray:
    counts = np.zeros(len(df))
    for _, group in df.groupby("customer"):
        times = group.event_ms.to_numpy()
        counts[group.index] = np.arange(len(times)) - np.searchsorted(times, times - 3_600_000) + 1
    return counts


def _auc_pr(df: pd.DataFrame, features: list[str]) -> float:
    train, test = df[df.day < 15], df[df.day >= 15]
    model = HistGradientBoostingClassifier(max_iter=150, random_state=0)
    model.fit(train[features].astype(float), train.is_fraud)
    return average_precision_score(test.is_fraud, model.predict_proba(test[features].astype(float))[:, 1])


def test_fraud_is_learnable_but_not_trivially(transactions):
    base_rate = transactions[transactions.day >= 15].is_fraud.mean()
    naive = _auc_pr(transactions, ["log_amount"])
    row_only = _auc_pr(transactions, ROW_FEATURES)
    full = _auc_pr(transactions, ROW_FEATURES + HISTORY_FEATURES)
    assert 0.003 < base_rate < 0.015
    assert naive < 5 * base_rate  # the amount alone says little
    assert row_only > 10 * base_rate
    assert full > row_only + 0.05  # behaviour over time (velocity, habits) carries real signal
    assert full < 0.85  # and the task stays hard: stealthy fraud, unreported fraud
