"""Pure transforms silver -> gold: per-entity rolling aggregates at every transaction's event time, generated
from the feature declarations (pipelines/gold/contract.py FEATURES): no code here names a feature.

Windows are (t - w, t] over event time in milliseconds, so a row includes its own transaction and never
anything later: nothing after t can leak into the features of t. Amounts are aggregated in US dollars.
Merchant fraud signals use only chargebacks reported by t (label_timestamp <= t), never later labels.

Two ways to compute a window (contract.SLIDING_WINDOWS says which):

- sliding: a range frame over the rows of D-1 and D (the customer's 1h and 24h windows, small frames):
  any aggregation, exact standard deviations and distinct counts;
- running, for whole-day windows: incremental by construction, the features of date D never read D's
  whole lookback row by row. For a window of w days and a transaction at t on D,

      agg(t - w, t] = daily(D-w .. D-1)  +  sum of D's rows up to t  -  sum of D-w's rows up to t - w

  `daily` comes from per-entity, per-event-date intermediate states kept beside silver (state.py: a count,
  sums and sums of squares of the inputs, `daily_parts`); the last two terms are one running sum (frame
  UNBOUNDED PRECEDING .. CURRENT ROW) over D's rows and D-w's rows shifted forward by w with their sign
  flipped. So a date reads the rows of D, D-1, D-7 and D-30 plus small daily states, and every window costs
  O(rows): Spark's sliding range frames recompute their aggregate over the whole frame for each row,
  quadratic in a busy merchant's volume. Count, sum, mean, sample std, share and per-transaction rates
  merge from those states (`_parts`); the contract refuses the others over a running window.

Reported inputs (a chargeback) enter the merchant's stream at their report time, from their own table
(`attributed_chargebacks`), and leave it w days later the same way.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from pipelines.contracts import CURRENCY_PER_USD, HOME_COUNTRIES
from pipelines.gold.contract import (
    CREATED_TIMESTAMP,
    ENTITIES,
    EVENT_TIMESTAMP,
    INPUTS,
    PARTITION_COLUMN,
    REPORTED_INPUTS,
    WINDOWS,
    Feature,
    features_of,
)

DAY_MS = 86_400_000
# An intermediate state: (input, statistic), the statistic one of n (how many), sum, sumsq, last (the
# latest event ms).
Part = tuple[str, str]
# A transaction's value of each input, on the columns `events` gives (the transaction itself counts 1).
_VALUE = {"amount_usd": "_usd", "is_foreign": "_foreign", "merchant_id": "merchant_id"}
# The state tables' column of a part: the names these tables had before the states were generated (their
# bytes), and `<input>_<statistic>` for every part declared since.
_STATE_NAMES = {
    ("transaction", "n"): "n",
    ("amount_usd", "sum"): "usd_sum",
    ("amount_usd", "sumsq"): "usd_sumsq",
    ("is_foreign", "sum"): "foreign_n",
    ("transaction", "last"): "last_ms",
}
_COUNT = ("transaction", "n")
_LAST = ("transaction", "last")


def key_of(entity: str) -> str:
    return f"{entity}_id"


def _parts(feature: Feature) -> tuple[Part, ...]:
    """The intermediate states a running feature merges from."""
    x, aggregation = feature.input, feature.aggregation
    if aggregation == "count":
        return ((x if x in REPORTED_INPUTS else "transaction", "n"),)
    if aggregation == "sum":
        return ((x, "sum"),)
    if aggregation in ("mean", "share"):
        return (_COUNT, (x, "sum"))
    if aggregation == "std":
        return (_COUNT, (x, "sum"), (x, "sumsq"))
    if aggregation == "per_transaction":
        return (_COUNT, (x, "n"))
    raise AssertionError(f"{feature.name}: {aggregation} is not mergeable (the contract refuses it)")


def _ordered(parts: set[Part]) -> tuple[Part, ...]:
    """Parts in the state tables' column order: the count, then each input's sum and sum of squares (in
    INPUTS order), then the latest time."""
    rank = {"n": 0, "sum": 1, "sumsq": 2}
    inputs = list(INPUTS)
    return tuple(
        sorted(parts, key=lambda p: (p == _LAST, p != _COUNT, inputs.index(p[0]), rank.get(p[1], 3)))
    )


def _running_features(entity: str) -> tuple[Feature, ...]:
    return tuple(f for f in features_of(entity) if f.window is not None and not f.sliding)


def _has_previous(entity: str) -> bool:
    return any(f.aggregation == "time_since_previous" for f in features_of(entity))


def daily_parts(entity: str) -> tuple[Part, ...]:
    """The per-day states of `entity`'s transactions its features merge from, in column order: always the
    count (state.py reads it for each arrival's record), and the latest time for time_since_previous."""
    parts = {p for f in _running_features(entity) for p in _parts(f) if p[0] not in REPORTED_INPUTS}
    return _ordered(parts | {_COUNT} | ({_LAST} if _has_previous(entity) else set()))


def state_column(part: Part) -> str:
    return _STATE_NAMES.get(part, f"{part[0]}_{part[1]}")


def daily_schema(entity: str) -> str:
    """The columns of `entity`'s per-day state table, besides arrival_date (the schema of an empty read)."""
    kinds = {"n": "long", "last": "long", "sum": "double", "sumsq": "double"}
    columns = ", ".join(f"{state_column(p)} {kinds[p[1]]}" for p in daily_parts(entity))
    return f"{key_of(entity)} string, event_date date, {columns}"


def _windows_days(entity: str) -> list[tuple[str, int]]:
    """The entity's running windows and their days, shortest first."""
    names = {f.window for f in _running_features(entity)}
    return sorted(((w, WINDOWS[w] // 86_400) for w in names if w is not None), key=lambda item: item[1])


def _window_parts(entity: str, window: str) -> tuple[Part, ...]:
    parts = {p for f in _running_features(entity) if f.window == window for p in _parts(f)}
    return _ordered(parts)


def _with_yesterday(entity: str) -> bool:
    """Whether the entity's stream holds D-1's rows: its sliding windows (at most 24h) reach into D-1."""
    return any(f.sliding for f in features_of(entity))


def _row_offsets() -> tuple[int, ...]:
    days = {0}
    for entity in ENTITIES:
        days |= {1} if _with_yesterday(entity) else set()
        days |= {d for _, d in _windows_days(entity)}
    return tuple(sorted(days))


# The event dates a date's features read row by row (D, D-1 for sliding windows and 1-day expiries, D-7,
# D-30 for the running windows' expiries).
ROW_OFFSETS = _row_offsets()


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


# --- daily states (the state kept per arrival date) --------------------------------------------------


def _exact_sum(column: Column) -> Column:
    """A sum that does not depend on the order Spark adds the rows in (a double sum does, in its last bits):
    each value carried to 1e-18 (finer than a double's own precision above 0.01) and added exactly as a
    decimal (at most 1e20: ANSI mode fails a larger sum instead of wrapping it). An arrival's daily totals
    are then the same bytes whichever other arrivals are derived in the same job and however its files are
    split."""
    return F.sum(column.cast("decimal(38,18)")).cast("double")


def _value(x: str) -> Column:
    return F.lit(1) if x == "transaction" else F.col(_VALUE[x])


def daily(evts: DataFrame, entity: str) -> DataFrame:
    """Per arrival date, entity and event date: the entity's daily_parts (count, sums and sums of squares
    exact whatever the order of the rows, latest event ms)."""
    aggregates = []
    for part in daily_parts(entity):
        x, statistic = part
        if statistic == "n":
            aggregates.append(F.count("*").alias(state_column(part)))
        elif statistic == "sum":
            aggregates.append(_exact_sum(_value(x)).alias(state_column(part)))
        elif statistic == "sumsq":
            aggregates.append(_exact_sum(_value(x) * _value(x)).alias(state_column(part)))
        else:
            aggregates.append(F.max("_ms").alias(state_column(part)))
    return evts.groupBy("arrival_date", key_of(entity), "event_date").agg(*aggregates)


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


def _base(part: Part, window: str) -> str:
    return f"_base_{part[0]}_{part[1]}_{window}"


def _run(part: Part, window: str) -> str:
    return f"_run_{part[0]}_{part[1]}_{window}"


def base(entity: str, daily_states: DataFrame, chargebacks: DataFrame | None, day: date) -> DataFrame:
    """Per entity, the whole days before `day` inside each running window (its parts summed from the daily
    states, reported inputs counted from their table), and the latest transaction before the rows the
    stream reads (D-1 and D, or D alone)."""
    key = key_of(entity)

    def inside(column: str, days: int) -> Column:
        return F.col(column).between(day - timedelta(days=days), day - timedelta(days=1))

    columns: list[Column] = []
    reported: list[Column] = []
    for window, days in _windows_days(entity):
        for part in _window_parts(entity, window):
            if part[0] in REPORTED_INPUTS:
                reported.append(
                    F.sum(F.when(inside("label_date", days), 1).otherwise(0)).alias(_base(part, window))
                )
                continue
            zero = 0 if part[1] == "n" else 0.0
            columns.append(
                F.sum(F.when(inside("event_date", days), F.col(state_column(part))).otherwise(zero)).alias(
                    _base(part, window)
                )
            )
    if _has_previous(entity):
        read_from = day - timedelta(days=2 if _with_yesterday(entity) else 1)
        columns.append(
            F.max(F.when(F.col("event_date") <= read_from, F.col(state_column(_LAST)))).alias("_base_last_ms")
        )
    out = daily_states.groupBy(key).agg(*columns)
    if reported:
        assert chargebacks is not None, "reported inputs are counted from their table"
        counted = chargebacks.groupBy(key).agg(*reported)
        out = out.join(counted, key, "full_outer").na.fill(0, [c for c in counted.columns if c != key])
    return out


def customer_base(daily_states: DataFrame, day: date) -> DataFrame:
    return base("customer", daily_states, None, day)


def merchant_base(daily_states: DataFrame, chargebacks: DataFrame, day: date) -> DataFrame:
    return base("merchant", daily_states, chargebacks, day)


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


def _part_value(part: Part) -> Column:
    x, statistic = part
    if statistic == "n":
        return F.lit(1)
    value = _value(x)
    return value * value if statistic == "sumsq" else value


def _zero(part: Part) -> Column:
    return F.lit(0) if part[1] == "n" else F.lit(0.0)


_RAW_TYPES = {"transaction": "int", "amount_usd": "double", "is_foreign": "double", "merchant_id": "string"}


def _raw(x: str) -> str:
    return f"_raw_{x}"


def _sliding_value(feature: Feature) -> Column:
    """A sliding feature's aggregate of its input's raw column (null on rows that are not D-1's or D's
    transactions), over its frame."""
    frame = _sliding("_key", WINDOWS[feature.window or ""])
    raw = F.col(_raw("transaction" if feature.aggregation == "count" else feature.input))
    if feature.aggregation == "distinct_count":
        return F.size(F.collect_set(raw).over(frame)).cast("long")
    if feature.aggregation == "per_transaction":
        return F.sum(raw).over(frame) / F.count(_raw("transaction")).over(frame)
    aggregate = {
        "count": F.count,
        "sum": F.sum,
        "mean": F.avg,
        "share": F.avg,
        "std": F.stddev_samp,
        "max": F.max,
    }[feature.aggregation]
    return aggregate(raw).over(frame)


def _merged(feature: Feature) -> Column:
    """A running feature from its parts: the whole days before D (base) plus the running sum."""
    window = feature.window or ""

    def total(part: Part) -> Column:
        return F.col(_base(part, window)) + F.col(_run(part, window))

    x, aggregation = feature.input, feature.aggregation
    if aggregation == "count":
        return total(_parts(feature)[0]).cast("long")
    if aggregation == "sum":
        return total((x, "sum"))
    n = total(_COUNT)
    if aggregation in ("mean", "share"):
        return total((x, "sum")) / n
    if aggregation == "per_transaction":
        return total((x, "n")) / n
    s, squares = total((x, "sum")), total((x, "sumsq"))
    variance = (squares - s * s / n) / (n - 1)
    # Sample standard deviation from sums; rounding can leave a tiny negative variance: clamp it.
    return F.when(n > 1, F.sqrt(F.greatest(variance, F.lit(0.0))))


def features(
    entity: str, evts: DataFrame, chargebacks: DataFrame | None, base_frame: DataFrame, day: date
) -> DataFrame:
    """`evts` (events()) of event dates D, D-1, D-7, D-30, `chargebacks` (attributed_chargebacks, for the
    merchant) reported on D and D-30, and `base_frame` (`base`) -> one row per transaction of `day`, with
    the entity's declared features in their declared order."""
    key = key_of(entity)
    declared = features_of(entity)
    sliding = [f for f in declared if f.sliding]
    windows = _windows_days(entity)
    parts = {window: _window_parts(entity, window) for window, _ in windows}
    transaction_parts = {w: [p for p in ps if p[0] not in REPORTED_INPUTS] for w, ps in parts.items()}
    reported_parts = {w: [p for p in ps if p[0] in REPORTED_INPUTS] for w, ps in parts.items()}
    zero = {_run(p, w): _zero(p) for w, ps in parts.items() for p in ps}
    raw_inputs = sorted(
        {"transaction", *(f.input for f in sliding)} - set(REPORTED_INPUTS), key=list(INPUTS).index
    )
    previous = _has_previous(entity)
    yesterday = _with_yesterday(entity)

    evts = evts.withColumnRenamed(key, "_key")
    raw_columns = {_raw(x): _value(x) for x in raw_inputs} if sliding else {}
    no_row: dict[str, Column] = {
        "_is_day": F.lit(False),
        **{name: F.lit(None).cast(_RAW_TYPES[name.removeprefix("_raw_")]) for name in raw_columns},
        **(
            {"_txn_ms": F.lit(None).cast("long"), "transaction_id": F.lit(None).cast("string")}
            if previous
            else {}
        ),
        EVENT_TIMESTAMP: F.lit(None).cast("timestamp"),
    }
    is_day = F.col("event_date") == F.lit(day)
    recent = (
        evts.where(F.col("event_date").isin(day, day - timedelta(days=1))) if yesterday else _on(evts, day, 0)
    )
    run_values = {
        _run(p, w): (F.when(is_day, _part_value(p)).otherwise(_zero(p)) if yesterday else _part_value(p))
        if p[0] not in REPORTED_INPUTS
        else _zero(p)
        for w, ps in parts.items()
        for p in ps
    }
    rows = recent.select(
        "_key",
        "_ms",
        *(v.alias(k) for k, v in run_values.items()),
        (is_day if yesterday else F.lit(True)).alias("_is_day"),
        *(v.alias(k) for k, v in raw_columns.items()),
        *([F.col("_ms").alias("_txn_ms"), F.col("transaction_id")] if previous else []),
        EVENT_TIMESTAMP,
    )
    stream = rows
    for window, days in windows:
        if transaction_parts[window]:
            negated = {_run(p, window): -_part_value(p) for p in transaction_parts[window]}
            stream = stream.unionByName(
                _shifted(_on(evts, day, days), days, negated, {**zero, **no_row}).select(*rows.columns)
            )
    if any(reported_parts.values()):
        assert chargebacks is not None, "reported inputs enter the stream from their table"
        reports = chargebacks.select(F.col(key).alias("_key"), F.col("label_ms").alias("_ms"), "label_date")
        arriving = {_run(p, w): F.lit(1) for w, ps in reported_parts.items() for p in ps}
        stream = stream.unionByName(
            reports.where(F.col("label_date") == F.lit(day))
            .select("_key", "_ms", *(v.alias(k) for k, v in (zero | arriving | no_row).items()))
            .select(*rows.columns)
        )
        for window, days in windows:
            if reported_parts[window]:
                expired = reports.where(F.col("label_date") == F.lit(day - timedelta(days=days)))
                leaving = {_run(p, window): F.lit(-1) for p in reported_parts[window]}
                stream = stream.unionByName(
                    _shifted(expired, days, leaving, {**zero, **no_row}).select(*rows.columns)
                )
    running = _running("_key")
    columns: list[Column] = [_sliding_value(f).alias(f.name) for f in sliding]
    columns += [F.sum(name).over(running).alias(name) for name in run_values]
    if previous:
        before = (
            Window.partitionBy("_key")
            .orderBy("_ms", "transaction_id")
            .rowsBetween(Window.unboundedPreceding, -1)
        )
        columns.append(F.max("_txn_ms").over(before).alias("_previous_ms"))
    out = stream.select("_key", "_ms", "_is_day", EVENT_TIMESTAMP, *columns).where("_is_day")
    out = out.join(base_frame.withColumnRenamed(key, "_key"), "_key", "left").na.fill(
        0, [c for c in base_frame.columns if c not in (key, "_base_last_ms")]
    )
    derived: dict[str, Column] = {}
    for feature in declared:
        if feature.sliding:
            derived[feature.name] = F.col(feature.name)
        elif feature.aggregation == "time_since_previous":
            previous_ms = F.coalesce(F.col("_previous_ms"), F.col("_base_last_ms"))
            derived[feature.name] = (F.col("_ms") - previous_ms) / 1000.0
        else:
            derived[feature.name] = _merged(feature)
    return _stamped(
        out.select(
            F.col("_key").alias(key), EVENT_TIMESTAMP, *(derived[f.name].alias(f.name) for f in declared)
        ),
        day,
    )


def customer_features(evts: DataFrame, base_frame: DataFrame, day: date) -> DataFrame:
    return features("customer", evts, None, base_frame, day)


def merchant_features(evts: DataFrame, chargebacks: DataFrame, base_frame: DataFrame, day: date) -> DataFrame:
    return features("merchant", evts, chargebacks, base_frame, day)


def _stamped(features: DataFrame, day: date) -> DataFrame:
    return features.select(
        "*",
        F.lit(created_at(day)).cast("timestamp").alias(CREATED_TIMESTAMP),
        F.lit(day).alias(PARTITION_COLUMN),
    )
