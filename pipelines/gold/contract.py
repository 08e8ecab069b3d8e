"""The gold feature tables: names, locations and columns, shared by the Spark jobs that write them and the
Feast repository that reads them. Plain Python: importing it costs nothing.

One gold row per transaction and entity: the entity's features as of that transaction's event time,
computed over windows (t - w, t] that include the transaction itself. A row is therefore the state of the
entity right after the transaction, which is what the online store holds when the next one is scored;
training joins with entity timestamp = event time - 1 ms to see the state just before each transaction.
Amounts are aggregated in US dollars (CURRENCY_PER_USD), so cardholders of different currencies compare.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

WINDOWS = {"1h": 3_600, "24h": 86_400, "7d": 7 * 86_400, "30d": 30 * 86_400}
LOOKBACK_DAYS = 30  # computing date D reads silver of D-30 .. D

CUSTOMER_TABLE = "customer_features"
MERCHANT_TABLE = "merchant_features"
PARTITION_COLUMN = "event_date"
EVENT_TIMESTAMP = "event_timestamp"
CREATED_TIMESTAMP = "created_timestamp"

CUSTOMER_FEATURES: tuple[str, ...] = (
    *(f"customer_txn_count_{w}" for w in WINDOWS),
    *(f"customer_amount_sum_{w}" for w in WINDOWS),
    *(f"customer_amount_mean_{w}" for w in WINDOWS),
    *(f"customer_amount_std_{w}" for w in WINDOWS),
    "customer_distinct_merchants_24h",
    "customer_seconds_since_previous",
    "customer_foreign_share_30d",
)
MERCHANT_FEATURES: tuple[str, ...] = (
    "merchant_txn_count_24h",
    "merchant_txn_count_7d",
    "merchant_amount_sum_24h",
    "merchant_amount_sum_7d",
    "merchant_chargebacks_30d",  # chargebacks reported by the event time, for transactions in (t - 30d, t]
    "merchant_fraud_rate_30d",  # merchant_chargebacks_30d / merchant transactions in (t - 30d, t]
)


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
