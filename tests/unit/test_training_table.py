"""The retrain writes its training set from Arrow (`build_training_table`) without a pandas round trip: the
file must hold the same table the frame of those rows held when it was written through pandas."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from training.dataset import LABEL, SPLIT, WEIGHT, _pandas, as_written


def _training_table() -> pa.Table:
    """Rows shaped as build_training_table returns them, with what a conversion can get wrong: a null
    string in the first row, a float column with NaN and nulls, a column of nulls only, int8 labels and
    microsecond UTC times."""
    stamp = pa.timestamp("us", tz="UTC")
    return pa.table(
        {
            "transaction_id": pa.array(["t1", "t2", "t3"]),
            "customer_id": pa.array([None, "c2", "c3"], pa.string()),
            "event_timestamp": pa.array([datetime(2026, 1, 1, h, tzinfo=UTC) for h in (1, 2, 3)], stamp),
            LABEL: pa.array([0, 1, 0], pa.int8()),
            "customer_amount_mean_1h": pa.array([math.nan, 2.5, None], pa.float64()),
            "merchant_fraud_rate_30d": pa.array([None, None, None], pa.float64()),
            "channel_code": pa.array([1.0, 0.0, 3.0]),
            SPLIT: pa.array(["train", "validation", "holdout"]),
            WEIGHT: pa.array([12.5, 1.0, 12.5]),
        }
    )


def test_the_table_is_written_as_its_frame_would_be():
    table = _training_table()
    through_pandas = as_written(_pandas(table))
    direct = as_written(table)
    assert direct.schema.equals(through_pandas.schema, check_metadata=True)
    assert direct.equals(through_pandas)
    # NaN became null, as pandas' conversion makes a missing float
    assert direct["customer_amount_mean_1h"].null_count == 2
    assert direct["event_timestamp"].type == pa.timestamp("ns", tz="UTC")


def test_an_empty_table_keeps_its_column_types():
    """pandas cannot type an empty object column (it would become Arrow's null type); the table's own
    schema does."""
    table = _training_table().slice(0, 0)
    direct = as_written(table)
    assert direct.num_rows == 0 and direct.schema.names == table.schema.names
    assert direct.schema.field("customer_id").type == pa.string()
    assert direct.schema.field("event_timestamp").type == pa.timestamp("ns", tz="UTC")


def test_a_set_without_a_known_fraud_in_its_train_split_is_refused_unless_asked_not_to():
    from datetime import date

    import pytest

    from training.dataset import TrainingSetError, _require_fraud

    table = _training_table()  # its only fraud is in the validation split
    with pytest.raises(TrainingSetError, match="no known fraud in its train split"):
        _require_fraud(table, date(2026, 1, 3), 30, require_fraud=True)
    with pytest.raises(TrainingSetError, match=r"\(0 transactions"):
        _require_fraud(table.slice(0, 0), date(2026, 1, 3), 30, require_fraud=True)
    _require_fraud(table, date(2026, 1, 3), 30, require_fraud=False)
    labelled = table.set_column(table.schema.get_field_index(LABEL), LABEL, pa.array([1, 0, 0], pa.int8()))
    _require_fraud(labelled, date(2026, 1, 3), 30, require_fraud=True)  # a fraud in train: accepted


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 10, 99, 100, 101, 1_000, 12_345, 999_983])
@pytest.mark.parametrize(
    "train,validation", [(0.7, 0.15), (0.8, 0.1), (0.6, 0.2), (1 / 3, 1 / 3), (0.5, 0.4)]
)
def test_split_sizes_count_the_ranks_as_dividing_each_would(rows, train, validation):
    """`_split_sizes` bisects; it counts what dividing every rank 1..n by n and comparing would count."""
    import numpy as np

    from training.dataset import SplitFractions, _split_sizes

    share = np.arange(1, rows + 1) / rows
    fractions = SplitFractions(train=train, validation=validation)
    expected = (int((share <= train).sum()), int((share <= train + validation).sum()))
    assert _split_sizes(rows, fractions) == expected
