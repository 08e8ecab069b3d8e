"""Pure transforms silver -> gold: per-entity rolling aggregates at every transaction's event time.

Windows are (t - w, t] over event time in milliseconds, so a row includes its own transaction and never
anything later: nothing after t can leak into the features of t. Amounts are aggregated in US dollars.
Merchant fraud signals use only chargebacks reported by t (label_timestamp <= t), never later labels.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from pipelines.contracts import CURRENCY_PER_USD, HOME_COUNTRIES
from pipelines.features.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP, PARTITION_COLUMN, WINDOWS


def _usd(amount: Column, currency: Column) -> Column:
    rates = F.create_map(*[x for code, rate in CURRENCY_PER_USD.items() for x in (F.lit(code), F.lit(rate))])
    return amount.cast("double") / rates[currency]


def _is_foreign(country: Column, currency: Column) -> Column:
    """Abroad: the merchant's country does not use the card's currency."""
    pairs = [F.lit(f"{c}:{cur}") for c, cur in HOME_COUNTRIES.items()]
    return (~F.concat_ws(":", country, currency).isin(*pairs)).cast("double")


def _window(key: str, seconds: int) -> Window:
    return Window.partitionBy(key).orderBy("_ms").rangeBetween(-(seconds * 1000 - 1), 0)


def created_at(day: date) -> datetime:
    """Gold rows of `day` become available at the end of its data interval: deterministic, so reruns and
    reproductions give identical tables."""
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


def customer_features(transactions: DataFrame, day: date) -> DataFrame:
    """Silver transactions of `day` and its lookback -> one row per transaction of `day`."""
    events = transactions.select(
        "customer_id",
        "merchant_id",
        "transaction_id",
        F.col("event_timestamp").alias(EVENT_TIMESTAMP),
        F.unix_millis("event_timestamp").alias("_ms"),
        _usd(F.col("amount"), F.col("currency")).alias("_usd"),
        _is_foreign(F.col("country"), F.col("currency")).alias("_foreign"),
    )
    columns: list[Column] = []
    for name, seconds in WINDOWS.items():
        w = _window("customer_id", seconds)
        columns += [
            F.count("*").over(w).alias(f"customer_txn_count_{name}"),
            F.sum("_usd").over(w).alias(f"customer_amount_sum_{name}"),
            F.avg("_usd").over(w).alias(f"customer_amount_mean_{name}"),
            F.stddev_samp("_usd").over(w).alias(f"customer_amount_std_{name}"),
        ]
    previous = Window.partitionBy("customer_id").orderBy("_ms", "transaction_id")
    columns += [
        F.size(F.collect_set("merchant_id").over(_window("customer_id", WINDOWS["24h"])))
        .cast("long")
        .alias("customer_distinct_merchants_24h"),
        ((F.col("_ms") - F.lag("_ms").over(previous)) / 1000.0).alias("customer_seconds_since_previous"),
        F.avg("_foreign").over(_window("customer_id", WINDOWS["30d"])).alias("customer_foreign_share_30d"),
    ]
    return _only_day(events.select("customer_id", EVENT_TIMESTAMP, *columns), day)


def merchant_features(transactions: DataFrame, chargebacks: DataFrame, day: date) -> DataFrame:
    """Silver transactions (lookback included) and chargebacks with their merchant -> one row per
    transaction of `day`. `chargebacks`: merchant_id, label_timestamp, is_fraud."""
    events = transactions.select(
        "merchant_id",
        F.col("event_timestamp").alias(EVENT_TIMESTAMP),
        F.unix_millis("event_timestamp").alias("_ms"),
        _usd(F.col("amount"), F.col("currency")).alias("_usd"),
        F.lit(1).alias("_txn"),
        F.lit(0).alias("_chargeback"),
    )
    reported = chargebacks.where(F.col("is_fraud") == 1).select(
        "merchant_id",
        F.col("label_timestamp").alias(EVENT_TIMESTAMP),
        F.unix_millis("label_timestamp").alias("_ms"),
        F.lit(0.0).alias("_usd"),
        F.lit(0).alias("_txn"),
        F.lit(1).alias("_chargeback"),
    )
    both = events.unionByName(reported)
    w24, w7, w30 = (_window("merchant_id", WINDOWS[k]) for k in ("24h", "7d", "30d"))
    chargebacks_30d = F.sum("_chargeback").over(w30)
    txns_30d = F.sum("_txn").over(w30)
    features = both.select(
        "merchant_id",
        EVENT_TIMESTAMP,
        "_txn",
        F.sum("_txn").over(w24).cast("long").alias("merchant_txn_count_24h"),
        F.sum("_txn").over(w7).cast("long").alias("merchant_txn_count_7d"),
        F.sum("_usd").over(w24).alias("merchant_amount_sum_24h"),
        F.sum("_usd").over(w7).alias("merchant_amount_sum_7d"),
        chargebacks_30d.cast("long").alias("merchant_chargebacks_30d"),
        (chargebacks_30d / txns_30d).alias("merchant_fraud_rate_30d"),
    )
    return _only_day(features.where(F.col("_txn") == 1).drop("_txn"), day)


def _only_day(features: DataFrame, day: date) -> DataFrame:
    return features.where(F.to_date(EVENT_TIMESTAMP) == F.lit(day)).select(
        "*",
        F.lit(created_at(day)).cast("timestamp").alias(CREATED_TIMESTAMP),
        F.lit(day).alias(PARTITION_COLUMN),
    )
