"""The label maturity read from the chargeback feed (training/label_maturity.py) and shown by `mlops doctor`,
on a hand-made lake: silver transactions and their fraud chargebacks, delays known."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.settings import Settings, TrainingSettings
from mlops.doctor import Status, _label_maturity
from pipelines.lake import Tables
from training.label_maturity import MIN_REPORTS, label_maturity, observed_delays

DAY = date(2026, 3, 31)


def _lake(settings: Settings, delays_days: list[float]) -> None:
    """One transaction a chargeback for each delay (reported on DAY), plus legitimate ones and a
    legitimate-label row that must not count."""
    tables = Tables(settings.lake)
    stamp = datetime(2026, 3, 31, 12, tzinfo=UTC)
    events = [stamp - timedelta(days=d) for d in delays_days]
    ids = [f"tx{i:016x}" for i in range(len(events))]
    for i, (tx, at) in enumerate(zip(ids, events, strict=True)):
        folder = tables.silver / f"arrival_date={at.date().isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.table({"transaction_id": [tx, f"legit{i}"], "event_timestamp": [at, at]}),
            folder / f"{i}.parquet",
        )
    folder = tables.silver_labels / f"arrival_date={DAY.isoformat()}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(
        pa.table(
            {
                "transaction_id": [*ids, "legit0"],
                "is_fraud": pa.array([1] * len(ids) + [0], pa.int32()),
                "label_timestamp": [stamp] * (len(ids) + 1),
            }
        ),
        folder / "labels.parquet",
    )


def _settings(tmp_path, **training) -> Settings:
    return Settings(home=tmp_path, training=TrainingSettings(**training))


def test_the_wait_follows_the_feeds_delays_once_there_are_enough(tmp_path):
    delays = [0.5 + 0.25 * i for i in range(40)]  # 0.5 .. 10.25 days
    settings = _settings(tmp_path, label_maturity_days=3, label_maturity_quantile=0.95)
    _lake(settings, delays)
    assert sorted(observed_delays(settings, DAY, 30).round(6)) == pytest.approx(delays)
    found = label_maturity(settings, DAY)
    assert found.days == 10 and found.reports == 40 and "observed" in found.source  # p95 = 9.76 -> 10
    # without the setting, the constant, and nothing is read
    assert label_maturity(_settings(tmp_path, label_maturity_days=3), DAY).days == 3


def test_too_few_chargebacks_keep_the_constant_and_say_why(tmp_path):
    settings = _settings(tmp_path, label_maturity_days=4, label_maturity_quantile=0.95)
    _lake(settings, [1.0] * (MIN_REPORTS - 1))
    found = label_maturity(settings, DAY)
    assert found.days == 4 and found.observed_days is None and f"fewer than {MIN_REPORTS}" in found.source


def test_doctor_warns_when_the_constant_is_shorter_than_the_feeds_delays(tmp_path):
    settings = _settings(tmp_path, label_maturity_days=3)
    _lake(settings, [0.5 + 0.25 * i for i in range(40)])
    check = _label_maturity(settings)
    assert check.status is Status.WARN and "9.8 days over 40 fraud chargebacks" in check.detail, check
    assert "MLOPS_TRAINING__LABEL_MATURITY_QUANTILE=0.95" in check.fix
    assert _label_maturity(_settings(tmp_path, label_maturity_days=12)).status is Status.OK
