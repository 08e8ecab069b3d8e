"""The training set's labeling, maturity window, splits and transaction columns, on tiny inline tables."""

from __future__ import annotations

import math
import re
from datetime import date

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.settings import Settings
from pipelines.contracts import CHANNELS, COUNTRIES, CURRENCY_PER_USD, HOME_COUNTRIES, MERCHANT_CATEGORIES
from pipelines.lake import Tables
from training.dataset import (
    CATEGORICAL_VOCAB,
    LABEL,
    SPLIT,
    WEIGHT,
    NothingToTrainError,
    SplitFractions,
    TrainingSetError,
    _split_and_sample,
    build_training_frame,
    labeled_transactions,
    time_splits,
    transaction_columns,
    unit_hash,
)

DAY = date(2026, 1, 10)


def _write(root, arrival: str, frame: pd.DataFrame) -> None:
    folder = root / f"arrival_date={arrival}"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), folder / "part-0.parquet")


def _transaction(tid: str, when: str, **overrides) -> dict:
    row = {
        "transaction_id": tid, "customer_id": "c1", "merchant_id": "m1", "amount": 10.0, "currency": "EUR",
        "country": "DE", "channel": "pos", "merchant_category": "grocery",
        "event_timestamp": pd.Timestamp(when, tz="UTC"),
    }  # fmt: skip
    return {**row, **overrides}


@pytest.fixture
def lake(tmp_path) -> Settings:
    settings = Settings(home=tmp_path)
    tables = Tables(settings.lake)
    _write(tables.silver, "2026-01-05", pd.DataFrame([_transaction("t1", "2026-01-05T10:00"),
                                                      _transaction("t2", "2026-01-05T11:00")]))  # fmt: skip
    _write(tables.silver, "2026-01-09", pd.DataFrame([_transaction("t3", "2026-01-09T12:00")]))
    _write(tables.silver, "2026-01-11", pd.DataFrame([_transaction("t4", "2026-01-11T12:00")]))  # after DAY
    labels = pd.DataFrame(
        {
            "transaction_id": ["t1", "t2", "t3"],
            "is_fraud": [True, True, True],
            # t2's chargeback is reported after the cutoff: it does not exist yet as of DAY
            "label_timestamp": pd.to_datetime(
                ["2026-01-07T00:00", "2026-01-11T00:00", "2026-01-10T08:00"], utc=True
            ),
        }
    )
    _write(tables.silver_labels, "2026-01-07", labels.iloc[[0]])
    _write(tables.silver_labels, "2026-01-11", labels.iloc[[1]])
    _write(tables.silver_labels, "2026-01-10", labels.iloc[[2]])
    return settings


def test_labels_are_what_was_known_at_the_cutoff(lake):
    frame = labeled_transactions(lake, DAY, window_days=30).set_index("transaction_id")
    assert set(frame.index) == {"t1", "t2", "t3"}  # t4 arrived after DAY
    assert frame[LABEL].to_dict() == {"t1": 1, "t2": 0, "t3": 1}


def test_transactions_younger_than_the_label_maturity_are_left_out(lake):
    frame = labeled_transactions(lake, DAY, window_days=30, label_maturity_days=3)
    assert list(frame["transaction_id"]) == ["t1", "t2"]  # t3 is 1.5 days old at the cutoff
    with pytest.raises(TrainingSetError, match="label maturity of 30 days"):
        labeled_transactions(lake, DAY, window_days=30, label_maturity_days=30)


def test_the_window_reads_only_its_arrival_dates(lake):
    assert list(labeled_transactions(lake, DAY, window_days=2)["transaction_id"]) == ["t3"]
    with pytest.raises(TrainingSetError, match="no silver transactions arrived"):
        labeled_transactions(lake, date(2026, 1, 3), window_days=1)


def test_without_gold_the_error_names_the_command_that_writes_it_and_no_silver_still_comes_first(lake):
    from features.repo import GoldTableMissingError
    from features.sources import GOLD_COMMAND

    # the registry is read in a thread beside the silver read: a missing gold table must still be named
    # (not Feast's "no such feature service"), and the retrain's skip on no silver must still come first
    with pytest.raises(GoldTableMissingError, match=re.escape(GOLD_COMMAND)):
        build_training_frame(lake, DAY, window_days=30)
    with pytest.raises(NothingToTrainError, match="no silver transactions arrived"):
        build_training_frame(lake, date(2026, 1, 3), window_days=1)


def test_splits_follow_event_time_with_the_holdout_last():
    times = pd.Series(pd.date_range("2026-01-01", periods=20, freq="h", tz="UTC")).sample(
        frac=1, random_state=3
    )
    splits = time_splits(times, SplitFractions(train=0.5, validation=0.25))
    by_time = splits.loc[times.sort_values().index].tolist()
    assert by_time == ["train"] * 10 + ["validation"] * 5 + ["holdout"] * 5
    with pytest.raises(ValueError, match="room for a holdout"):
        SplitFractions(train=0.8, validation=0.2)


def test_transaction_columns_flag_foreign_cards_and_code_unknown_categories_as_zero():
    frame = pd.DataFrame(
        [
            _transaction("a", "2026-01-10T00:00", country="DE", currency="EUR"),  # home
            _transaction("b", "2026-01-10T06:00", country="BR", currency="EUR"),  # abroad
            _transaction("c", "2026-01-11T12:00", channel="telepathy"),  # a Sunday; unknown channel
        ]
    )
    columns = transaction_columns(frame)
    assert columns["is_foreign"].tolist() == [0.0, 1.0, 0.0]
    assert columns["channel_code"].tolist() == [1.0, 1.0, 0.0]
    assert columns["is_weekend"].tolist() == [1.0, 1.0, 1.0]  # 2026-01-10 is a Saturday
    assert columns["hour_cos"].iloc[0] == pytest.approx(1.0)
    assert columns["log_amount_usd"].iloc[0] == pytest.approx(math.log1p(10 / 0.92))


def _labeled(rows: int, fraud_every: int) -> pa.Table:
    times = pd.date_range("2026-01-01", periods=rows, freq="s", tz="UTC")
    return pa.table(
        {
            "transaction_id": [f"tx{i:016x}" for i in range(rows)],
            "event_timestamp": pa.array(times.to_pydatetime(), pa.timestamp("us", tz="UTC")),
            LABEL: pa.array([1 if i % fraud_every == 0 else 0 for i in range(rows)], pa.int8()),
        }
    )


def test_sampling_keeps_every_fraud_caps_the_fit_rows_and_weighs_the_sampled_holdout():
    table = _labeled(20_000, fraud_every=50)
    fractions = SplitFractions()
    full, unsampled = _split_and_sample(table, fractions, max_fit_rows=None)
    assert unsampled["negative_sample_rate"] == 1.0 and full.num_rows == 20_000
    assert set(full[WEIGHT].to_pylist()) == {1.0}
    sampled, sampling = _split_and_sample(
        table.take(list(range(19_999, -1, -1))), fractions, max_fit_rows=3_000
    )
    frame, whole = sampled.to_pandas(), full.to_pandas()
    fit, whole_fit = frame[frame[SPLIT] != "holdout"], whole[whole[SPLIT] != "holdout"]
    assert sampling["fit_rows_before_sampling"] == len(whole_fit) == 17_000
    rate = sampling["negative_sample_rate"]
    assert 0.159 < rate < 0.160  # (3000 - 340 frauds) / 16660 legitimate
    assert abs(len(fit) - 3_000) < 200  # a hash, not an exact count
    # every fraud stays, in the split it had, and the splits did not move
    assert frame.groupby(SPLIT)[LABEL].sum().to_dict() == whole.groupby(SPLIT)[LABEL].sum().to_dict()
    assert set(frame["transaction_id"]) <= set(whole["transaction_id"])
    merged = frame.merge(whole, on="transaction_id", suffixes=("", "_whole"))
    assert (merged[SPLIT] == merged[f"{SPLIT}_whole"]).all()
    # the holdout at the same rate, each legitimate row standing for 1 / rate of them
    holdout, whole_holdout = frame[frame[SPLIT] == "holdout"], whole[whole[SPLIT] == "holdout"]
    assert len(holdout) < len(whole_holdout) / 3
    assert set(holdout.loc[holdout[LABEL] == 1, WEIGHT]) == {1.0}
    assert holdout.loc[holdout[LABEL] == 0, WEIGHT].unique().tolist() == [1 / rate]
    assert abs(holdout[WEIGHT].sum() - len(whole_holdout)) < 0.1 * len(whole_holdout)
    assert (frame["event_timestamp"].diff().dropna() >= pd.Timedelta(0)).all()  # sorted by event time
    again, _ = _split_and_sample(table, fractions, max_fit_rows=3_000)
    assert again.equals(sampled)  # the same inputs in any order give the same rows


@pytest.mark.parametrize("max_fit_rows", [None, 700])
def test_splits_by_selection_equal_the_splits_of_a_full_sort(max_fit_rows):
    """_split_and_sample decides splits without sorting every row (a partition, then the ids tied at the
    boundary's time); the reference sorts everything and splits by rank. Times tie in runs of 7 rows and
    some (time, id) pairs repeat; both boundaries fall inside a run of ties (asserted)."""
    import numpy as np

    rng = np.random.default_rng(3)
    rows = 2_000
    seconds = np.arange(rows) // 7  # runs of 7 equal times: 1,200 and 1,600 rows fall inside runs
    ids = [f"tx{int(i):04d}" for i in rng.integers(0, 1_900, rows)]
    table = pa.table(
        {
            "transaction_id": ids,
            "event_timestamp": pa.array(
                (pd.Timestamp("2026-01-01", tz="UTC") + pd.to_timedelta(seconds, unit="s")).to_pydatetime(),
                pa.timestamp("us", tz="UTC"),
            ),
            LABEL: pa.array((rng.random(rows) < 0.05).astype("int8")),
            "row": pa.array(np.arange(rows)),
        }
    ).take(rng.permutation(rows))
    fractions = SplitFractions(train=0.6, validation=0.2)
    got, sampling = _split_and_sample(table, fractions, max_fit_rows)

    reference = table.take(
        pa.compute.sort_indices(
            table, sort_keys=[("event_timestamp", "ascending"), ("transaction_id", "ascending")]
        )
    ).to_pandas()
    reference[SPLIT] = time_splits(pd.Series(np.arange(rows)), fractions).to_numpy()
    for before, after in (("train", "validation"), ("validation", "holdout")):
        last = reference.loc[reference[SPLIT] == before, "event_timestamp"].iloc[-1]
        assert reference.loc[reference[SPLIT] == after, "event_timestamp"].iloc[0] == last
    rate = sampling["negative_sample_rate"]
    if max_fit_rows is not None:
        assert rate < 1.0
        keep = (reference[LABEL] == 1) | (unit_hash(pa.array(reference["transaction_id"])) < rate)
        reference = reference[keep.to_numpy()]
    frame = got.to_pandas()
    assert frame["row"].tolist() == reference["row"].tolist()  # same rows, same order
    assert frame[SPLIT].tolist() == reference[SPLIT].tolist()
    assert (frame.loc[frame[LABEL] == 0, WEIGHT] == 1 / rate).all()


def test_unit_hash_depends_on_the_bytes_only():
    ids = pa.array([f"tx{i:016x}" for i in range(100_000)])
    values = unit_hash(ids)
    assert ((values >= 0) & (values < 1)).all()
    assert abs(values.mean() - 0.5) < 0.01 and len(set(values.tolist())) == len(values)
    sliced = unit_hash(pa.chunked_array([ids.slice(0, 7), ids.slice(7)]))
    assert (sliced == values).all()  # chunks and offsets do not matter
    assert unit_hash(pa.array(["tx0000000000000005"]))[0] == values[5]
    assert unit_hash(pa.array(["", "a"])).tolist()[0] != unit_hash(pa.array(["a"])).tolist()[0]


def test_transaction_inputs_equal_the_pandas_formula_the_training_sets_were_built_with():
    """`transaction_inputs` (numpy, shared with the scoring service) must give the training set's values
    bit for bit: the formula of earlier releases, in pandas, is the oracle."""
    rng = np.random.default_rng(7)
    n = 2000
    currencies = list(CURRENCY_PER_USD)
    countries = [*COUNTRIES, None]
    frame = pd.DataFrame(
        {
            "amount": np.round(rng.uniform(0.01, 5000, n), 2),
            "currency": rng.choice(currencies, n),
            "country": [countries[i] for i in rng.integers(0, len(countries), n)],
            "channel": rng.choice([*CHANNELS, "telepathy"], n),
            "merchant_category": rng.choice(MERCHANT_CATEGORIES, n),
            "event_timestamp": pd.to_datetime(
                rng.integers(1_700_000_000_000, 1_800_000_000_000, n), unit="ms", utc=True
            ),
        }
    )
    old = pd.DataFrame(index=frame.index)
    rate = frame["currency"].map(CURRENCY_PER_USD).astype("float64")
    old["log_amount_usd"] = np.log1p(frame["amount"].astype("float64") / rate)
    hour = frame["event_timestamp"].dt.hour + frame["event_timestamp"].dt.minute / 60.0
    old["hour_sin"] = np.sin(2 * np.pi * hour / 24.0)
    old["hour_cos"] = np.cos(2 * np.pi * hour / 24.0)
    old["is_weekend"] = (frame["event_timestamp"].dt.dayofweek >= 5).astype("float64")
    old["is_foreign"] = (frame["country"].map(HOME_COUNTRIES) != frame["currency"]).astype("float64")
    for column, vocab in CATEGORICAL_VOCAB.items():
        codes = {value: index + 1 for index, value in enumerate(vocab)}
        old[f"{column}_code"] = frame[column].map(codes).fillna(0).astype("float64")
    pd.testing.assert_frame_equal(transaction_columns(frame), old, check_exact=True)


def test_transaction_inputs_of_arrow_columns_equal_those_of_lists():
    """The feature rows pass Arrow columns (a function call per distinct value), the scoring service lists
    (a call per value): the same numbers, missing and unknown values included."""
    from decimal import Decimal

    from training.dataset import amount_as_float, transaction_inputs

    rng = np.random.default_rng(3)
    n = 500

    def draw(values: list) -> list:
        return [values[i] for i in rng.integers(0, len(values), size=n)]

    currency = draw([*CURRENCY_PER_USD, "XXX", None])
    country = draw([*COUNTRIES, "ZZ", "", None])
    categoricals = {
        "channel": draw([*CHANNELS, "", None, "teleport"]),
        "merchant_category": draw([*MERCHANT_CATEGORIES, None]),
        "country": country,
    }
    amount = rng.uniform(0.01, 5000, size=n)
    event_ms = rng.integers(1_700_000_000_000, 1_800_000_000_000, size=n)
    listed = transaction_inputs(amount, currency, country, event_ms, categoricals)
    arrow = transaction_inputs(
        amount,
        pa.chunked_array([pa.array(currency[:200]), pa.array(currency[200:])]),
        pa.array(country),
        event_ms,
        {k: pa.array(v) for k, v in categoricals.items()},
    )
    assert listed.keys() == arrow.keys()
    for name in listed:
        np.testing.assert_array_equal(arrow[name], listed[name], err_msg=name)
    cents = rng.integers(-(10**11), 10**11, size=n)
    decimals = [Decimal(int(c)) / 100 for c in cents]
    exact = amount_as_float(pa.array(decimals, pa.decimal128(12, 2)))
    np.testing.assert_array_equal(exact, np.array([float(d) for d in decimals]))
