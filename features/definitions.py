"""Feast definitions over the gold tables: entities, sources, feature views and the model's feature service.

The sources point into the lake, which is only known at run time (`MLOPS_HOME`), so the definitions are
built by `build_definitions(lake)` rather than at import. Feast is imported inside the function: importing
`feast` makes a temporary folder and sets PROMETHEUS_MULTIPROC* variables for the whole process (its
metrics module does so at import), and takes seconds; neither belongs in an import of this module.

Column names and types come from the gold contract (`pipelines.gold.contract`), the single source both
the Spark writer and this reader follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.gold.contract import (
    CREATED_TIMESTAMP,
    CUSTOMER_FEATURES,
    CUSTOMER_TABLE,
    EVENT_TIMESTAMP,
    FEATURES,
    MERCHANT_FEATURES,
    MERCHANT_TABLE,
    table_path,
)

if TYPE_CHECKING:
    from feast import Entity, FeatureService, FeatureView, FileSource

CUSTOMER_JOIN_KEY = "customer_id"
MERCHANT_JOIN_KEY = "merchant_id"
CUSTOMER_VIEW = "customer_stats_fv"
MERCHANT_VIEW = "merchant_stats_fv"
FEATURE_SERVICE = "fraud_model_v1"

# TTL: how old a gold row may be and still be served (online) or joined (offline) as the entity's state.
# A gold row is the entity's state right after its latest transaction. Its longest customer window is 30
# days: a row older than that has every windowed aggregate fully expired, so it says nothing true about
# the customer and a null ("no recent activity") is the honest answer. Merchants see traffic every day;
# one silent for 7 days (the longest of its volume windows) is dormant or gone, and its volume features
# would mislead, so the merchant view expires after 7 days.
CUSTOMER_TTL = timedelta(days=30)
MERCHANT_TTL = timedelta(days=7)

# Each feature's type is its declaration's (pipelines/gold/contract.py FEATURES): counts int64, every other
# feature (sums, means, std, shares, rates, seconds) float64.
INTEGER_FEATURES: frozenset[str] = frozenset(f.name for f in FEATURES if f.dtype == "int64")


@dataclass(frozen=True)
class FraudFeatureDefinitions:
    """Every Feast object of the repository, built for one lake."""

    customer: Entity
    merchant: Entity
    customer_source: FileSource
    merchant_source: FileSource
    customer_stats_fv: FeatureView
    merchant_stats_fv: FeatureView
    fraud_model_v1: FeatureService

    @property
    def objects(self) -> list:
        """What `FeatureStore.apply` takes, in dependency order."""
        return [
            self.customer,
            self.merchant,
            self.customer_source,
            self.merchant_source,
            self.customer_stats_fv,
            self.merchant_stats_fv,
            self.fraud_model_v1,
        ]

    @property
    def feature_views(self) -> list[FeatureView]:
        return [self.customer_stats_fv, self.merchant_stats_fv]


def feature_dtype(name: str):
    """The Feast type of a gold feature column."""
    from feast.types import Float64, Int64

    return Int64 if name in INTEGER_FEATURES else Float64


def build_definitions(lake: Path) -> FraudFeatureDefinitions:
    """The repository's objects, with sources reading the gold tables under `lake`."""
    from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
    from feast.types import String

    customer = Entity(
        name="customer",
        join_keys=[CUSTOMER_JOIN_KEY],
        value_type=ValueType.STRING,
        description="A cardholder (one card).",
    )
    merchant = Entity(
        name="merchant",
        join_keys=[MERCHANT_JOIN_KEY],
        value_type=ValueType.STRING,
        description="A merchant accepting card payments.",
    )
    customer_source = FileSource(
        name="customer_features_source",
        path=str(table_path(lake, CUSTOMER_TABLE)),
        timestamp_field=EVENT_TIMESTAMP,
        created_timestamp_column=CREATED_TIMESTAMP,
        description="Gold: one row per transaction, the customer's state right after it.",
    )
    merchant_source = FileSource(
        name="merchant_features_source",
        path=str(table_path(lake, MERCHANT_TABLE)),
        timestamp_field=EVENT_TIMESTAMP,
        created_timestamp_column=CREATED_TIMESTAMP,
        description="Gold: one row per transaction, the merchant's state right after it.",
    )
    customer_stats_fv = FeatureView(
        name=CUSTOMER_VIEW,
        entities=[customer],
        ttl=CUSTOMER_TTL,
        schema=[
            Field(name=CUSTOMER_JOIN_KEY, dtype=String),
            *(Field(name=name, dtype=feature_dtype(name)) for name in CUSTOMER_FEATURES),
        ],
        source=customer_source,
        online=True,
        description="Cardholder spending: counts, sums, means and spread over 1h/24h/7d/30d windows.",
    )
    merchant_stats_fv = FeatureView(
        name=MERCHANT_VIEW,
        entities=[merchant],
        ttl=MERCHANT_TTL,
        schema=[
            Field(name=MERCHANT_JOIN_KEY, dtype=String),
            *(Field(name=name, dtype=feature_dtype(name)) for name in MERCHANT_FEATURES),
        ],
        source=merchant_source,
        online=True,
        description="Merchant volume and chargeback history.",
    )
    fraud_model_v1 = FeatureService(
        name=FEATURE_SERVICE,
        features=[customer_stats_fv, merchant_stats_fv],
        description="The features the fraud model v1 is trained on and scored with.",
    )
    return FraudFeatureDefinitions(
        customer=customer,
        merchant=merchant,
        customer_source=customer_source,
        merchant_source=merchant_source,
        customer_stats_fv=customer_stats_fv,
        merchant_stats_fv=merchant_stats_fv,
        fraud_model_v1=fraud_model_v1,
    )
