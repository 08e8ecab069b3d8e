"""The lake's layout and its writes: where each table lives, partition writes that replace exactly what
they contain, one writer per table, and JSON records written atomically.

Tables are Parquet, partitioned by `arrival_date` (and `stage` for quarantine). Spark is imported only
for type checking: the layout (`Tables`) is read by processes that have no Spark, such as the training pod.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class Tables:
    """Where the transaction tables of one installation live."""

    lake: Path

    @property
    def bronze(self) -> Path:
        return self.lake / "bronze" / "transactions"

    @property
    def silver(self) -> Path:
        return self.lake / "silver" / "transactions"

    @property
    def quarantine(self) -> Path:
        return self.lake / "quarantine" / "transactions"

    def reconciliation(self, day: date) -> Path:
        return self.lake / "reconciliation" / "transactions" / f"arrival_date={day.isoformat()}.json"

    @property
    def silver_labels(self) -> Path:
        return self.lake / "silver" / "labels"

    @property
    def quarantine_labels(self) -> Path:
        return self.lake / "quarantine" / "labels"

    def labels_reconciliation(self, day: date) -> Path:
        return self.lake / "reconciliation" / "labels" / f"arrival_date={day.isoformat()}.json"

    @staticmethod
    def partition(root: Path, day: date, **more: str) -> Path:
        path = root / f"arrival_date={day.isoformat()}"
        for key, value in more.items():
            path = path / f"{key}={value}"
        return path


@contextmanager
def table_lock(root: Path) -> Iterator[None]:
    """One writer per table at a time (the DAG also runs one date at a time)."""
    root.mkdir(parents=True, exist_ok=True)
    with (root / "_LOCK").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def overwrite_partitions(
    df: DataFrame, root: Path, partition_by: list[str], now_empty: tuple[Path, ...] = ()
) -> None:
    """Write `df` into `root`, replacing exactly the partitions it contains (dynamic overwrite).

    Spark stages the output in `root/.spark-staging-<job>` and moves each partition into place at job
    commit; a job killed before that leaves the old partition untouched and only the hidden staging folder,
    which the next write removes. Partitions in `now_empty` get no rows from this run: they are deleted, so
    a rerun that finds nothing for them does not leave old rows behind.
    """
    with table_lock(root):
        for leftover in [*root.glob(".spark-staging-*"), *root.glob("_temporary")]:
            shutil.rmtree(leftover, ignore_errors=True)
        for partition in now_empty:
            if partition.exists():
                shutil.rmtree(partition)
        df.write.mode("overwrite").partitionBy(*partition_by).parquet(str(root))


def clear_partitions(root: Path, partitions: tuple[Path, ...]) -> None:
    with table_lock(root):
        for partition in partitions:
            if partition.exists():
                shutil.rmtree(partition)


def read_partitions(spark: SparkSession, root: Path, days: list[date]) -> DataFrame | None:
    """The arrival dates of a table that exist among `days` (None if none), `arrival_date` restored."""
    paths = [str(Tables.partition(root, d)) for d in days if Tables.partition(root, d).is_dir()]
    return spark.read.option("basePath", str(root)).parquet(*paths) if paths else None


def read_partition(spark: SparkSession, root: Path, day: date) -> DataFrame:
    """One arrival date of a table, with `arrival_date` restored from the path."""
    return spark.read.option("basePath", str(root)).parquet(str(Tables.partition(root, day)))


def write_json(path: Path, payload: dict) -> None:
    """Write a JSON record atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(temp, path)


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None
