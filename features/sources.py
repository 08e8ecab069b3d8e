"""Gold as the source of the feature views: which gold table each view reads, keyed by which entity, and
the dataset of a table's partitions (or an error naming the command that writes it)."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings
from features.definitions import CUSTOMER_JOIN_KEY, MERCHANT_JOIN_KEY
from features.repo import GoldTableMissingError
from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, PARTITION_COLUMN, table_path

# The step that writes gold, named in errors when a gold table is missing.
GOLD_COMMAND = "mlops features --date YYYY-MM-DD --step build_gold"
TABLE_OF_VIEW = {"customer_stats_fv": CUSTOMER_TABLE, "merchant_stats_fv": MERCHANT_TABLE}
KEY_OF_VIEW = {"customer_stats_fv": CUSTOMER_JOIN_KEY, "merchant_stats_fv": MERCHANT_JOIN_KEY}


def gold_dataset(lake: Path, table: str):
    import pyarrow as pa
    import pyarrow.dataset as ds

    path = table_path(lake, table)
    if not path.is_dir() or not any(path.glob(f"{PARTITION_COLUMN}=*/*.parquet")):
        raise GoldTableMissingError(
            f"gold table {table!r} has no partitions at {path} "
            f"(expected {PARTITION_COLUMN}=YYYY-MM-DD/*.parquet); write gold first: {GOLD_COMMAND}"
        )
    partitioning = ds.partitioning(pa.schema([(PARTITION_COLUMN, pa.string())]), flavor="hive")
    return ds.dataset(path, format="parquet", partitioning=partitioning)


def require_gold(settings: Settings) -> None:
    """Raise GoldTableMissingError, naming the command that writes it, when a gold table has no partition."""
    for table in (CUSTOMER_TABLE, MERCHANT_TABLE):
        gold_dataset(settings.lake, table)
