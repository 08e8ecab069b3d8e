"""How long a transaction's label takes to mature, from the chargeback feed itself.

A transaction counts as legitimate in a training set only once its chargeback, if any, would have arrived:
the training set leaves out the last `label_maturity_days` before its as-of date, and the monitor judges a
day's performance that long after it. A constant suits one feed; card chargebacks mature over weeks, and a
too-short wait trains on fraud labelled legitimate. So the delays are measured: for the fraud chargebacks
that arrived in the window, the time from the transaction to its report. With
`training.label_maturity_quantile` set (0.95: 95% of chargebacks are in by then), the wait is that quantile
of the observed delays, in whole days, once at least MIN_REPORTS were seen (before, the constant, said so);
unset, the constant `training.label_maturity_days`, and `mlops doctor` warns when the feed's 95th percentile
is longer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.settings import Settings

MIN_REPORTS = 30  # fewer chargebacks than this: too few to read a 95th percentile from
DOCTOR_QUANTILE = 0.95
DAY_S = 86_400.0


@dataclass(frozen=True)
class Maturity:
    days: int  # what the training set and the monitor wait
    source: str  # where `days` comes from, said
    observed_days: float | None  # the quantile of the observed delays, in days (None: too few reports)
    quantile: float
    reports: int  # fraud chargebacks measured


def observed_delays(settings: Settings, day: date, window_days: int) -> np.ndarray:
    """Days from each transaction to its fraud chargeback, for the chargebacks that arrived in the
    `window_days` up to `day` whose transaction is in silver (an empty array before any)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from model_contract.inputs import utc
    from pipelines.lake import Tables
    from training.dataset import read_partitions

    tables = Tables(settings.lake)
    first = day - timedelta(days=window_days - 1)
    if not any(tables.silver_labels.glob("arrival_date=*/*.parquet")):
        return np.zeros(0)
    labels = read_partitions(
        tables.silver_labels, first, day, ["transaction_id", "is_fraud", "label_timestamp"]
    )
    labels = utc(labels.filter(pc.cast(labels["is_fraud"], pa.bool_())), "label_timestamp")
    if labels.num_rows == 0:
        return np.zeros(0)
    # a chargeback reports a transaction of up to the feed's longest delay before it
    transactions = read_partitions(
        tables.silver, first - timedelta(days=90), day, ["transaction_id", "event_timestamp"]
    )
    transactions = utc(
        transactions.filter(pc.is_in(transactions["transaction_id"], value_set=labels["transaction_id"])),
        "event_timestamp",
    )
    joined = labels.join(transactions, "transaction_id", join_type="inner")
    if joined.num_rows == 0:
        return np.zeros(0)
    seconds = pc.divide(
        pc.cast(pc.subtract(joined["label_timestamp"], joined["event_timestamp"]), pa.int64()), 1_000_000
    )
    delays = np.asarray(seconds.to_numpy(zero_copy_only=False), dtype="float64") / DAY_S
    return delays[delays >= 0]


def label_maturity(settings: Settings, day: date, observe: bool = False) -> Maturity:
    """The wait the training set as of `day` and the monitor apply (see the module docstring). With the
    constant in force nothing is read unless `observe` (what `mlops doctor` shows beside it)."""
    training = settings.training
    quantile = training.label_maturity_quantile
    fixed = training.label_maturity_days
    if quantile is None and not observe:
        return Maturity(fixed, "fixed (training.label_maturity_days)", None, DOCTOR_QUANTILE, 0)
    delays = observed_delays(settings, day, training.window_days)
    q = quantile if quantile is not None else DOCTOR_QUANTILE
    observed = float(np.quantile(delays, q)) if len(delays) >= MIN_REPORTS else None
    if quantile is None:
        return Maturity(fixed, "fixed (training.label_maturity_days)", observed, q, len(delays))
    if observed is None:
        return Maturity(
            fixed,
            f"fixed: {len(delays)} fraud chargebacks in the last {training.window_days} days, fewer than "
            f"{MIN_REPORTS} to read a percentile from (training.label_maturity_days until then)",
            None,
            q,
            len(delays),
        )
    return Maturity(
        math.ceil(observed),
        f"observed: the {q:.0%} quantile of {len(delays)} fraud chargebacks' delays",
        observed,
        q,
        len(delays),
    )
