"""Pure transforms silver -> gold: per-entity rolling aggregates at every transaction's event time.

Windows are (t - w, t] over event time in milliseconds, so a row includes its own transaction and never
anything later: nothing after t can leak into the features of t. Amounts are aggregated in US dollars.
Merchant fraud signals use only chargebacks reported by t (label_timestamp <= t), never later labels.

Incremental by construction: the features of date D never read D's whole lookback row by row. For a window
of w whole days and a transaction at t on D,

    agg(t - w, t] = daily(D-w .. D-1)  +  sum of D's rows up to t  -  sum of D-w's rows up to t - w

`daily` comes from per-entity, per-event-date totals kept beside silver (state.py); the last two terms are
one running sum (frame UNBOUNDED PRECEDING .. CURRENT ROW) over D's rows and D-w's rows shifted forward by
w with their sign flipped. So a date reads the rows of D, D-1, D-7 and D-30 plus small daily totals, and
every window costs O(rows) — Spark's sliding range frames recompute their aggregate over the whole frame
for each row, quadratic in a busy merchant's volume. Sliding frames remain only where frames are small:
a customer's 1h and 24h windows (over D-1 and D), which also give exact standard deviations and the
distinct merchant count.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from pipelines.contracts import CURRENCY_PER_USD, HOME_COUNTRIES
from pipelines.gold.contract import (
    CREATED_TIMESTAMP,
    CUSTOMER_FEATURES,
    EVENT_TIMESTAMP,
    MERCHANT_FEATURES,
    PARTITION_COLUMN,
    WINDOWS,
)

DAY_MS = 86_400_000
# Gold column order: per window count, sum, mean, std; then the other customer features.
_PER_WINDOW = tuple(
    f"customer_{kind}_{w}"
    for w in WINDOWS
    for kind in ("txn_count", "amount_sum", "amount_mean", "amount_std")
)
CUSTOMER_COLUMNS = (*_PER_WINDOW, *(c for c in CUSTOMER_FEATURES if c not in _PER_WINDOW))
# Whole-day windows computed from daily totals, and the event dates a date's features read row by row.
LONG_WINDOWS = {"7d": 7, "30d": 30}
ROW_OFFSETS = (0, 1, *LONG_WINDOWS.values())  # D, D-1 (1h and 24h windows), D-7, D-30


def _usd(amount: Column, currency: Column) -> Column:
    rates = F.create_map(*[x for code, rate in CURRENCY_PER_USD.items() for x in (F.lit(code), F.lit(rate))])
    return amount.cast("double") / rates[currency]


def _is_foreign(country: Column, currency: Column) -> Column:
    """Abroad: the merchant's country does not use the card's currency."""
    pairs = [F.lit(f"{c}:{cur}") for c, cur in HOME_COUNTRIES.items()]
    return (~F.concat_ws(":", country, currency).isin(*pairs)).cast("double")


def created_at(day: date) -> datetime:
    """Gold rows of `day` become available at the end of its data interval: deterministic, so reruns and
    reproductions give identical tables."""
    return datetime.combine(day + timedelta(days=1), time.min, tzinfo=UTC)


def events(silver: DataFrame) -> DataFrame:
    """Silver transactions -> the columns every feature needs (amount in USD, abroad flag, epoch ms)."""
    return silver.select(
        "customer_id",
        "merchant_id",
        "transaction_id",
        "event_date",
        *(["arrival_date"] if "arrival_date" in silver.columns else []),
        F.col("event_timestamp").alias(EVENT_TIMESTAMP),
        F.unix_millis("event_timestamp").alias("_ms"),
        _usd(F.col("amount"), F.col("currency")).alias("_usd"),
        _is_foreign(F.col("country"), F.col("currency")).alias("_foreign"),
    )


# --- daily totals (the state kept per arrival date) -------------------------------------------------------


def _exact_sum(column: Column) -> Column:
    """A sum that does not depend on the order Spark adds the rows in (a double sum does, in its last bits):
    each value carried to 1e-18 (finer than a double's own precision above 0.01) and added exactly as a
    decimal (at most 1e20: ANSI mode fails a larger sum instead of wrapping it). An arrival's daily totals
    are then the same bytes whichever other arrivals are derived in the same job and however its files are
    split."""
    return F.sum(column.cast("decimal(38,18)")).cast("double")


def customer_daily(evts: DataFrame) -> DataFrame:
    """Per arrival date, customer and event date: count, USD sum and sum of squares, abroad count, last ms."""
    return evts.groupBy("arrival_date", "customer_id", "event_date").agg(
        F.count("*").alias("n"),
        _exact_sum(F.col("_usd")).alias("usd_sum"),
        _exact_sum(F.col("_usd") * F.col("_usd")).alias("usd_sumsq"),
        F.sum("_foreign").alias("foreign_n"),
        F.max("_ms").alias("last_ms"),
    )


def merchant_daily(evts: DataFrame) -> DataFrame:
    """Per arrival date, merchant and event date: transaction count and USD sum."""
    return evts.groupBy("arrival_date", "merchant_id", "event_date").agg(
        F.count("*").alias("n"), _exact_sum(F.col("_usd")).alias("usd_sum")
    )


def attributed_chargebacks(labels: DataFrame, merchants: DataFrame, reach_days: int) -> DataFrame:
    """Fraud chargebacks with the merchant of their transaction: arrival_date (of the label), merchant_id,
    label date and ms. `merchants`: transaction_id, merchant_id and transaction_arrival (the arrival date
    of the transaction's silver row). A chargeback is matched only to transactions of the arrivals from
    `reach_days` before its own to its own, so its merchant does not depend on which other arrivals are
    derived in the same job."""
    within = F.col("transaction_arrival").between(
        F.date_sub("arrival_date", reach_days), F.col("arrival_date")
    )
    return (
        labels.where(F.col("is_fraud") == 1)
        .join(merchants, "transaction_id")
        .where(within)
        .select(
            "arrival_date",
            "merchant_id",
            F.to_date("label_timestamp").alias("label_date"),
            F.unix_millis("label_timestamp").alias("label_ms"),
        )
    )


def customer_base(daily: DataFrame, day: date) -> DataFrame:
    """Per customer, the whole days before `day` inside each long window, and the last transaction time
    before D-1 (D-1 and D themselves are read row by row)."""
    columns = []
    for name, days in LONG_WINDOWS.items():
        inside = F.col("event_date").between(day - timedelta(days=days), day - timedelta(days=1))
        columns += [
            F.sum(F.when(inside, F.col("n")).otherwise(0)).alias(f"_base_n_{name}"),
            F.sum(F.when(inside, F.col("usd_sum")).otherwise(0.0)).alias(f"_base_sum_{name}"),
            F.sum(F.when(inside, F.col("usd_sumsq")).otherwise(0.0)).alias(f"_base_sq_{name}"),
        ]
    thirty = F.col("event_date").between(day - timedelta(days=30), day - timedelta(days=1))
    columns += [
        F.sum(F.when(thirty, F.col("foreign_n")).otherwise(0.0)).alias("_base_foreign_30d"),
        F.max(F.when(F.col("event_date") <= day - timedelta(days=2), F.col("last_ms"))).alias(
            "_base_last_ms"
        ),
    ]
    return daily.groupBy("customer_id").agg(*columns)


def merchant_base(daily: DataFrame, chargebacks: DataFrame, day: date) -> DataFrame:
    """Per merchant, the whole days before `day` inside each window: transactions (24h, 7d, 30d), USD sums
    (24h, 7d) and chargebacks reported (30d)."""

    def inside(column: str, days: int) -> Column:
        return F.col(column).between(day - timedelta(days=days), day - timedelta(days=1))

    txns = daily.groupBy("merchant_id").agg(
        *(
            F.sum(F.when(inside("event_date", days), F.col("n")).otherwise(0)).alias(f"_base_n_{days}")
            for days in (1, 7, 30)
        ),
        *(
            F.sum(F.when(inside("event_date", days), F.col("usd_sum")).otherwise(0.0)).alias(
                f"_base_sum_{days}"
            )
            for days in (1, 7)
        ),
    )
    reported = (
        chargebacks.where(inside("label_date", 30))
        .groupBy("merchant_id")
        .agg(F.count("*").alias("_base_cb_30"))
    )
    return txns.join(reported, "merchant_id", "full_outer").na.fill(0, ["_base_cb_30"])


# --- features of one date ----------------------------------------------------------------------------------


def _on(evts: DataFrame, day: date, days_before: int) -> DataFrame:
    return evts.where(F.col("event_date") == F.lit(day - timedelta(days=days_before)))


def _running(key: str) -> WindowSpec:
    return Window.partitionBy(key).orderBy("_ms").rangeBetween(Window.unboundedPreceding, Window.currentRow)


def _sliding(key: str, seconds: int) -> WindowSpec:
    return Window.partitionBy(key).orderBy("_ms").rangeBetween(-(seconds * 1000 - 1), 0)


def _shifted(rows: DataFrame, days: int, values: dict[str, Column], zeros: dict[str, Column]) -> DataFrame:
    """Rows of D-days moved to their expiry time (t + days), carrying negated values: a running sum that
    passes them forgets them."""
    return rows.select(
        "_key",
        (F.col("_ms") + days * DAY_MS).alias("_ms"),
        *(v.alias(k) for k, v in {**zeros, **values}.items()),
    )


def customer_features(evts: DataFrame, base: DataFrame, day: date) -> DataFrame:
    """`evts` (events()) of event dates D, D-1, D-7, D-30 and `base` (customer_base) -> one row per
    transaction of `day`."""
    evts = evts.withColumnRenamed("customer_id", "_key")
    usd, sq = F.col("_usd"), F.col("_usd") * F.col("_usd")
    long_values = {
        "7d": {"_n_7d": F.lit(1), "_sum_7d": usd, "_sq_7d": sq},
        "30d": {"_n_30d": F.lit(1), "_sum_30d": usd, "_sq_30d": sq, "_foreign_30d": F.col("_foreign")},
    }
    zero = {k: F.lit(0.0) if not k.startswith("_n_") else F.lit(0) for v in long_values.values() for k in v}
    no_row = {
        "_is_day": F.lit(False),
        "_txn_ms": F.lit(None).cast("long"),
        "_raw_usd": F.lit(None).cast("double"),
        "_merchant": F.lit(None).cast("string"),
        "transaction_id": F.lit(None).cast("string"),
        EVENT_TIMESTAMP: F.lit(None).cast("timestamp"),
    }
    recent = evts.where(F.col("event_date").isin(day, day - timedelta(days=1)))
    is_day = F.col("event_date") == F.lit(day)
    rows = recent.select(
        "_key",
        "_ms",
        *(
            F.when(is_day, v).otherwise(zero[k]).alias(k)
            for values in long_values.values()
            for k, v in values.items()
        ),
        is_day.alias("_is_day"),
        F.col("_ms").alias("_txn_ms"),
        F.col("_usd").alias("_raw_usd"),
        F.col("merchant_id").alias("_merchant"),
        "transaction_id",
        EVENT_TIMESTAMP,
    )
    stream = rows
    for name, days in LONG_WINDOWS.items():
        negated = {k: -v for k, v in long_values[name].items()}
        stream = stream.unionByName(
            _shifted(_on(evts, day, days), days, negated, {**zero, **no_row}).select(*rows.columns)
        )
    running = _running("_key")
    columns: list[Column] = []
    for name in ("1h", "24h"):
        w = _sliding("_key", WINDOWS[name])
        columns += [
            F.count("_raw_usd").over(w).alias(f"customer_txn_count_{name}"),
            F.sum("_raw_usd").over(w).alias(f"customer_amount_sum_{name}"),
            F.avg("_raw_usd").over(w).alias(f"customer_amount_mean_{name}"),
            F.stddev_samp("_raw_usd").over(w).alias(f"customer_amount_std_{name}"),
        ]
    columns.append(
        F.size(F.collect_set("_merchant").over(_sliding("_key", WINDOWS["24h"])))
        .cast("long")
        .alias("customer_distinct_merchants_24h")
    )
    for name in LONG_WINDOWS:
        columns += [
            F.sum(f"_{part}_{name}").over(running).alias(f"_run_{part}_{name}") for part in ("n", "sum", "sq")
        ]
    columns.append(F.sum("_foreign_30d").over(running).alias("_run_foreign_30d"))
    previous = (
        Window.partitionBy("_key").orderBy("_ms", "transaction_id").rowsBetween(Window.unboundedPreceding, -1)
    )
    features = stream.select(
        "_key",
        "_ms",
        "_is_day",
        EVENT_TIMESTAMP,
        *columns,
        F.max("_txn_ms").over(previous).alias("_previous_ms"),
    ).where("_is_day")
    features = features.join(base.withColumnRenamed("customer_id", "_key"), "_key", "left").na.fill(
        0, [c for c in base.columns if c != "customer_id" and c != "_base_last_ms"]
    )
    derived: dict[str, Column] = {}
    for name in LONG_WINDOWS:
        n = F.col(f"_base_n_{name}") + F.col(f"_run_n_{name}")
        total = F.col(f"_base_sum_{name}") + F.col(f"_run_sum_{name}")
        squares = F.col(f"_base_sq_{name}") + F.col(f"_run_sq_{name}")
        variance = (squares - total * total / n) / (n - 1)
        derived |= {
            f"customer_txn_count_{name}": n.cast("long"),
            f"customer_amount_sum_{name}": total,
            f"customer_amount_mean_{name}": total / n,
            # Sample standard deviation from sums; rounding can leave a tiny negative variance: clamp it.
            f"customer_amount_std_{name}": F.when(n > 1, F.sqrt(F.greatest(variance, F.lit(0.0)))),
        }
    previous_ms = F.coalesce(F.col("_previous_ms"), F.col("_base_last_ms"))
    derived["customer_seconds_since_previous"] = (F.col("_ms") - previous_ms) / 1000.0
    derived["customer_foreign_share_30d"] = (F.col("_base_foreign_30d") + F.col("_run_foreign_30d")) / (
        F.col("_base_n_30d") + F.col("_run_n_30d")
    )
    out = features.select(
        F.col("_key").alias("customer_id"),
        EVENT_TIMESTAMP,
        *(derived[c].alias(c) if c in derived else F.col(c) for c in CUSTOMER_COLUMNS),
    )
    return _stamped(out, day)


def merchant_features(evts: DataFrame, chargebacks: DataFrame, base: DataFrame, day: date) -> DataFrame:
    """`evts` of event dates D, D-1, D-7, D-30, `chargebacks` (attributed_chargebacks) reported on D and
    D-30, and `base` (merchant_base) -> one row per transaction of `day`."""
    evts = evts.withColumnRenamed("merchant_id", "_key")
    usd = F.col("_usd")
    parts = ("_c24", "_s24", "_c7", "_s7", "_t30", "_cb30")
    zero = {k: F.lit(0.0) if k.startswith("_s") else F.lit(0) for k in parts}
    rows = _on(evts, day, 0).select(
        "_key",
        "_ms",
        *(
            v.alias(k)
            for k, v in {
                "_c24": F.lit(1),
                "_s24": usd,
                "_c7": F.lit(1),
                "_s7": usd,
                "_t30": F.lit(1),
                "_cb30": F.lit(0),
            }.items()
        ),
        F.lit(True).alias("_is_day"),
        EVENT_TIMESTAMP,
    )
    no_row = {"_is_day": F.lit(False), EVENT_TIMESTAMP: F.lit(None).cast("timestamp")}
    expiring = {
        1: {"_c24": F.lit(-1), "_s24": -usd},
        7: {"_c7": F.lit(-1), "_s7": -usd},
        30: {"_t30": F.lit(-1)},
    }
    stream = rows
    for days, values in expiring.items():
        stream = stream.unionByName(
            _shifted(_on(evts, day, days), days, values, {**zero, **no_row}).select(*rows.columns)
        )
    reports = chargebacks.select(
        F.col("merchant_id").alias("_key"), F.col("label_ms").alias("_ms"), "label_date"
    )
    reported = reports.where(F.col("label_date") == F.lit(day))
    stream = stream.unionByName(
        reported.select(
            "_key", "_ms", *(v.alias(k) for k, v in (zero | {"_cb30": F.lit(1)} | no_row).items())
        ).select(*rows.columns)
    )
    expired = reports.where(F.col("label_date") == F.lit(day - timedelta(days=30)))
    stream = stream.unionByName(
        _shifted(expired, 30, {"_cb30": F.lit(-1)}, {**zero, **no_row}).select(*rows.columns)
    )
    running = _running("_key")
    features = (
        stream.select("_key", "_is_day", EVENT_TIMESTAMP, *(F.sum(k).over(running).alias(k) for k in parts))
        .where("_is_day")
        .join(base.withColumnRenamed("merchant_id", "_key"), "_key", "left")
        .na.fill(0, [c for c in base.columns if c != "merchant_id"])
    )
    chargebacks_30d = F.col("_base_cb_30") + F.col("_cb30")
    derived = {
        "merchant_txn_count_24h": (F.col("_base_n_1") + F.col("_c24")).cast("long"),
        "merchant_txn_count_7d": (F.col("_base_n_7") + F.col("_c7")).cast("long"),
        "merchant_amount_sum_24h": F.col("_base_sum_1") + F.col("_s24"),
        "merchant_amount_sum_7d": F.col("_base_sum_7") + F.col("_s7"),
        "merchant_chargebacks_30d": chargebacks_30d.cast("long"),
        "merchant_fraud_rate_30d": chargebacks_30d / (F.col("_base_n_30") + F.col("_t30")),
    }
    out = features.select(
        F.col("_key").alias("merchant_id"), EVENT_TIMESTAMP, *(derived[c].alias(c) for c in MERCHANT_FEATURES)
    )
    return _stamped(out, day)


def _stamped(features: DataFrame, day: date) -> DataFrame:
    return features.select(
        "*",
        F.lit(created_at(day)).cast("timestamp").alias(CREATED_TIMESTAMP),
        F.lit(day).alias(PARTITION_COLUMN),
    )
