"""The gold feature tables: names, locations and columns, shared by the Spark jobs that write them and the
Feast repository that reads them. Plain Python: importing it costs nothing.

One gold row per transaction and entity: the entity's features as of that transaction's event time,
computed over windows (t - w, t] that include the transaction itself. A row is therefore the state of the
entity right after the transaction, which is what the online store holds when the next one is scored;
training joins with entity timestamp = event time - 1 ms to see the state just before each transaction.
Amounts are aggregated in US dollars (CURRENCY_PER_USD), so cardholders of different currencies compare.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from datetime import date
from pathlib import Path

WINDOWS = {"1h": 3_600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
LOOKBACK_DAYS = 30  # computing date D reads silver of D-30 .. D

CUSTOMER_TABLE = "customer_features"
MERCHANT_TABLE = "merchant_features"
PARTITION_COLUMN = "event_date"
EVENT_TIMESTAMP = "event_timestamp"
CREATED_TIMESTAMP = "created_timestamp"

# Inputs a feature aggregates: a column of the transaction or an expression over it (pipelines/gold/
# transforms.py computes them once per transaction; features/live/ from the same transaction online).
INPUTS = {
    "transaction": "the transaction itself (counted)",
    "amount_usd": "the amount in US dollars (amount / CURRENCY_PER_USD[currency])",
    "merchant_id": "the merchant's pseudonym",
    "is_foreign": "1 when the country is not the currency's home country (HOME_COUNTRIES), else 0",
    "chargeback": "a fraud chargeback attributed to the merchant, at the time it was reported",
}
# Aggregations over a window (t - w, t]; "time_since_previous" has no window.
AGGREGATIONS = {
    "count": "how many",
    "sum": "their sum",
    "mean": "their mean",
    "std": "their sample standard deviation (null below two)",
    "distinct_count": "how many distinct values",
    "share": "the share of the entity's transactions for which the input is 1",
    "per_transaction": "how many of the input per transaction of the entity in the window",
    "time_since_previous": "seconds since the entity's previous transaction (null: none in the lookback)",
    "max": "the largest",
}
# How a window is computed (pipelines/gold/transforms.py). A sliding window keeps its frame's rows, so any
# aggregation works, but its cost grows with the rows in the frame: only the customer's short windows
# (a cardholder's day is a few transactions) slide. Every other window is whole days and runs on per-day
# intermediate states (counts, sums, sums of squares; state.py) plus a running sum over the date's rows,
# which merges only the aggregations below; a busy merchant costs O(rows) either way.
SLIDING_WINDOWS = {"customer": ("1h", "24h"), "merchant": ()}
MERGEABLE = ("count", "sum", "mean", "std", "share", "per_transaction")
# Inputs counted at another time than the transaction's: a chargeback at the time it was reported.
REPORTED_INPUTS = ("chargeback",)


@dataclass(frozen=True)
class Feature:
    """One gold feature, declared once: its entity, the input it aggregates, how, over which window, its
    type and what it means. The gold tables' columns, the Feast views' types, the scoring service's live
    rows and the model's inputs all follow from FEATURES (docs/data-engineers.md, "Add a feature")."""

    name: str
    entity: str  # "customer" or "merchant"
    input: str  # a key of INPUTS
    aggregation: str  # a key of AGGREGATIONS
    window: str | None  # a key of WINDOWS; None for time_since_previous
    dtype: str  # "int64" or "float64"
    description: str
    # Why the feature is deprecated and what replaces it (from DEPRECATED); empty while it is current.
    deprecated: str = ""

    def __post_init__(self) -> None:
        where = f"feature {self.name!r} (pipelines/gold/contract.py FEATURES)"
        if self.entity not in ENTITIES:
            raise ValueError(f"{where}: entity {self.entity!r} is not one of {sorted(ENTITIES)}")
        if self.input not in INPUTS:
            raise ValueError(f"{where}: input {self.input!r} is not one of {sorted(INPUTS)}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"{where}: aggregation {self.aggregation!r} is not one of {sorted(AGGREGATIONS)}"
            )
        if (self.window is None) != (self.aggregation == "time_since_previous"):
            raise ValueError(
                f"{where}: window {self.window!r}: every aggregation but time_since_previous has one"
            )
        if self.window is not None and self.window not in WINDOWS:
            raise ValueError(f"{where}: window {self.window!r} is not one of {sorted(WINDOWS)}")
        if not isinstance(self.deprecated, str):
            raise ValueError(f"{where}: deprecated is the reason, a string, not {self.deprecated!r}")
        if self.dtype not in ("int64", "float64"):
            raise ValueError(f"{where}: dtype {self.dtype!r} is not int64 or float64")
        if not self.name.startswith(f"{self.entity}_"):
            raise ValueError(f"{where}: a feature's name starts with its entity ({self.entity}_)")
        if self.window is not None and not self.sliding:
            if WINDOWS[self.window] % 86_400:
                raise ValueError(
                    f"{where}: the {self.entity}'s window {self.window!r} is not whole days, and only the "
                    f"windows {SLIDING_WINDOWS[self.entity]} of the {self.entity} slide"
                )
            if self.aggregation not in MERGEABLE:
                raise ValueError(
                    f"{where}: {self.aggregation!r} over {self.window} cannot be merged from per-day states; "
                    f"declare it over a sliding window of the {self.entity} ({SLIDING_WINDOWS[self.entity]}) "
                    f"or use one of {MERGEABLE}"
                )
        if self.input in REPORTED_INPUTS and (
            self.sliding or self.aggregation not in {"count", "per_transaction"}
        ):
            raise ValueError(
                f"{where}: {self.input!r} is counted when reported: count or per_transaction over whole days"
            )
        if self.aggregation in {"share", "per_transaction"} and self.input == "transaction":
            raise ValueError(
                f"{where}: {self.aggregation!r} of the transaction itself is 1: use another input"
            )
        if self.aggregation in {"sum", "mean", "std", "max", "share"} and self.input in {
            "transaction",
            "merchant_id",
        }:
            raise ValueError(f"{where}: {self.aggregation!r} needs a numeric input, not {self.input!r}")
        if self.aggregation == "distinct_count" and self.input in {"transaction", *REPORTED_INPUTS}:
            raise ValueError(f"{where}: distinct_count needs a column of the transaction, not {self.input!r}")
        if self.input in REPORTED_INPUTS and self.entity != "merchant":
            raise ValueError(f"{where}: {self.input!r} is attributed to the merchant of its transaction")
        if self.input == "merchant_id" and self.entity == "merchant":
            raise ValueError(f"{where}: merchant_id is the merchant's own key")
        if self.aggregation == "count" and self.input not in {"transaction", *REPORTED_INPUTS}:
            raise ValueError(f"{where}: count is of transactions or of reports, not of {self.input!r}")
        if self.aggregation == "time_since_previous" and self.input != "transaction":
            raise ValueError(f"{where}: time_since_previous is of the transaction itself")
        if self.input == "merchant_id" and self.aggregation != "distinct_count":
            raise ValueError(f"{where}: merchant_id is a pseudonym: only distinct_count of it")

    @property
    def sliding(self) -> bool:
        """Computed over a sliding frame of rows (else from per-day states; see SLIDING_WINDOWS)."""
        return self.window in SLIDING_WINDOWS[self.entity]

    @property
    def key(self) -> tuple[str, str, str | None]:
        """What the feature computes, independent of its name: (input, aggregation, window)."""
        return (self.input, self.aggregation, self.window)


ENTITIES = ("customer", "merchant")


def _windowed(
    entity: str, stem: str, input_: str, aggregation: str, dtype: str, what: str, windows=tuple(WINDOWS)
) -> list[Feature]:
    return [
        Feature(f"{entity}_{stem}_{w}", entity, input_, aggregation, w, dtype, f"{what} in the last {w}")
        for w in windows
    ]


def _per_window(entity: str, *families: tuple[str, str, str, str, str]) -> list[Feature]:
    """Each window's features of several families, window by window: (stem, input, aggregation, dtype,
    what) per family."""
    return [
        feature
        for window in WINDOWS
        for family in families
        for feature in _windowed(entity, *family, windows=(window,))
    ]


# Every gold feature, in the order of the gold tables' columns (the order is the tables' bytes: keep it and
# add a new feature at the end of its entity's).
FEATURES: tuple[Feature, ...] = (
    *_per_window(
        "customer",
        ("txn_count", "transaction", "count", "int64", "the customer's transactions"),
        ("amount_sum", "amount_usd", "sum", "float64", "USD the customer spent"),
        ("amount_mean", "amount_usd", "mean", "float64", "mean USD amount"),
        ("amount_std", "amount_usd", "std", "float64", "sample std of the USD amounts"),
    ),
    Feature(
        "customer_distinct_merchants_24h", "customer", "merchant_id", "distinct_count", "24h", "int64",
        "distinct merchants the customer paid in the last 24h",
    ),
    Feature(
        "customer_seconds_since_previous", "customer", "transaction", "time_since_previous", None, "float64",
        "seconds since the customer's previous transaction within the lookback",
    ),
    Feature(
        "customer_foreign_share_30d", "customer", "is_foreign", "share", "30d", "float64",
        "share of the customer's transactions in the last 30d made abroad",
    ),
    *_windowed(
        "merchant", "txn_count", "transaction", "count", "int64", "the merchant's transactions", ("24h", "7d")
    ),
    *_windowed(
        "merchant", "amount_sum", "amount_usd", "sum", "float64", "USD the merchant took", ("24h", "7d")
    ),
    Feature(
        "merchant_chargebacks_30d", "merchant", "chargeback", "count", "30d", "int64",
        "chargebacks reported by the event time, for the merchant's transactions in (t - 30d, t]",
    ),
    Feature(
        "merchant_fraud_rate_30d", "merchant", "chargeback", "per_transaction", "30d", "float64",
        "merchant_chargebacks_30d / the merchant's transactions in (t - 30d, t]",
    ),
)  # fmt: skip

# Deprecated features: name -> why, and what replaces it. A deprecated feature keeps its column in gold, its
# Feast field and its live value, since a served or shadowed version may take it, but versions trained from
# now on do not (model_contract/inputs.py TRAINING_INPUTS). Remove its declaration only once `mlops features
# check` says no version in use takes it (docs/data-engineers.md, "Deprecate and remove a feature").
DEPRECATED: dict[str, str] = {}


def _deprecate(features: tuple[Feature, ...], deprecated: dict[str, str]) -> tuple[Feature, ...]:
    """`features` with each one named in `deprecated` marked; a name nothing declares is refused."""
    declared = {f.name for f in features}
    unknown = sorted(set(deprecated) - declared)
    if unknown:
        raise ValueError(
            f"pipelines/gold/contract.py DEPRECATED names {unknown}, which FEATURES does not declare: a "
            "removed feature leaves DEPRECATED with its declaration"
        )
    for name, why in deprecated.items():
        if not isinstance(why, str) or not why.strip():
            raise ValueError(
                f"pipelines/gold/contract.py DEPRECATED[{name!r}]: say why, and what replaces it"
            )
    return tuple(replace(f, deprecated=deprecated[f.name]) if f.name in deprecated else f for f in features)


FEATURES = _deprecate(FEATURES, DEPRECATED)


def features_of(entity: str) -> tuple[Feature, ...]:
    return tuple(f for f in FEATURES if f.entity == entity)


def _unique(features: tuple[Feature, ...]) -> tuple[Feature, ...]:
    names = [f.name for f in features]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"pipelines/gold/contract.py FEATURES declares {twice} more than once")
    return features


# What gold's columns are computed as: a date built for another format is built again (job.plan_gold).
# Deprecation is not in it: a deprecated feature's column is computed as before.
FEATURES_FORMAT = hashlib.sha256(
    repr([(f.name, f.entity, f.input, f.aggregation, f.window, f.dtype) for f in FEATURES]).encode()
).hexdigest()[:16]
CUSTOMER_FEATURES: tuple[str, ...] = tuple(f.name for f in _unique(features_of("customer")))
MERCHANT_FEATURES: tuple[str, ...] = tuple(f.name for f in _unique(features_of("merchant")))
FEATURE_BY_NAME: dict[str, Feature] = {f.name: f for f in FEATURES}


def gold_root(lake: Path) -> Path:
    return lake / "gold"


def table_path(lake: Path, table: str) -> Path:
    return gold_root(lake) / table


def validation_path(lake: Path, day: date) -> Path:
    """Where validate_gold keeps the date's GX results (read back as lineage by training)."""
    return lake / "validation" / "gold" / f"{PARTITION_COLUMN}={day.isoformat()}.json"


def builds_root(lake: Path) -> Path:
    """Where build_gold records what each date's gold was built from. Beside gold, not in it: the records
    name silver files (Spark's random names) and their times, so inside gold they would make its bytes, and
    its DVC hash, differ between two builds of the same rows."""
    return lake / "state" / "gold_builds"


def build_path(lake: Path, day: date) -> Path:
    """What a date's gold was built from (each input arrival's signature): the features stage rebuilds the
    date when these change (late events, re-deliveries, out-of-order arrivals)."""
    return builds_root(lake) / f"{PARTITION_COLUMN}={day.isoformat()}.json"


def gold_revision_path(home: Path, day: date) -> Path:
    """Where version_gold keeps the DVC revision of the date's gold as it last versioned it (the training
    set's lineage names the revisions of the gold it read)."""
    return home / "datasets" / "gold" / f"{PARTITION_COLUMN}={day.isoformat()}.rev.json"
