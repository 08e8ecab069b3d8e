"""The lake's layout and its writes: where each table lives, partition writes that replace exactly what
they contain (staged, then swapped in atomically: see `overwrite_partitions`), one writer per table, and JSON
records written atomically.

Tables are Parquet, partitioned by `arrival_date` (and `stage` for quarantine). Spark is imported only
for type checking: the layout (`Tables`) is read by processes that have no Spark, such as the training pod.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import shutil
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType


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


STAGING = ".staging"  # hidden: Spark and Arrow readers of a table skip names that start with "." or "_"
RETIRED = "retired-"  # a finished write's staging folder, kept for readers of the versions it replaced
# How long the versions a write replaced stay readable (from the folder a reader opened before the swap). A
# Spark or Arrow scan lists a partition and opens its files within seconds; the disk they hold is one
# write's replaced partitions of each table.
RETAIN_REPLACED_S = 600.0
KILL_AT_ENV = "MLOPS_LAKE_KILL_AT"
RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def overwrite_partitions(
    df: DataFrame,
    root: Path,
    partition_by: list[str],
    now_empty: tuple[Path, ...] = (),
    before_swap: Callable[[Path], None] | None = None,
    retain_s: float = RETAIN_REPLACED_S,
) -> None:
    """Write `df` into `root`, replacing exactly the partitions it contains; a reader never sees one of
    them missing, empty or half-written, and a process killed at any point leaves each partition whole.

    Spark writes the frame into a fresh folder `root/.staging/<run>/`; `before_swap` then runs on each
    staged partition (the gold job rewrites its files there). Only then, one partition at a time, the staged
    folder and the live one trade places in one atomic rename (`_swap_in`); the old version is left in the
    staging folder. Partitions in `now_empty` get no rows from this run: they are renamed aside into it too,
    so a rerun that finds nothing for them does not leave old rows behind. The staging folder is then
    retired, not deleted (where it replaced anything): a reader that opened a partition's folder just before
    its swap still lists the whole old version from it (an empty or partial listing would read as a wrong
    answer). Retired folders are deleted by the first write of the table at least `retain_s` seconds later
    (`RETAIN_REPLACED_S`; 0 deletes at once). Leftovers of a killed run never hold the only copy of a
    partition: the next write deletes them.

    A reader that listed a partition's files by path just before its swap and opens one after it fails with
    "file not found" (a rerun reads the new version); it never reads a mix, a part, or a missing date as
    empty.
    """
    with table_lock(root):
        _clear_leftovers(root, retain_s)
        run = root / STAGING / uuid.uuid4().hex
        staged_root = run / "data"
        # A fresh folder: a static overwrite goes through Spark's committer, no rename per partition.
        df.write.mode("overwrite").option("partitionOverwriteMode", "static").partitionBy(
            *partition_by
        ).parquet(str(staged_root))
        staged = _leaves(staged_root, partition_by)
        for partition in staged:
            if before_swap is not None:
                before_swap(partition)
        _kill_point("staged")
        produced = {root / p.relative_to(staged_root) for p in staged}
        replaced = False
        for number, partition in enumerate(staged, start=1):
            replaced |= _swap_in(partition, root / partition.relative_to(staged_root), run)
            _kill_point(f"swapped-{number}")
        for partition in now_empty:
            replaced |= _remove_except(partition, produced, run)
        _kill_point("swapped")
        _retire(run, retain_s if replaced else 0)


def rewrite_partitions(
    root: Path, rewrite: Callable[[Path, list[Path]], Any | None], retain_s: float = RETAIN_REPLACED_S
) -> list[Path]:
    """Rewrite some of `root`'s arrival partitions without Spark, holding the table's lock throughout (so no
    other write lands between the read and the swap): `rewrite(partition, files)` returns the partition's new
    rows as an Arrow table, or None to leave it as it is. A table with no row removes the partition. The new
    versions are staged and swapped in as `overwrite_partitions` does; the partitions rewritten, in order.
    For an erasure, `retain_s=0`: no version that held the removed rows is kept, nor any an earlier write
    kept (they go first)."""
    import pyarrow.parquet as pq

    done = []
    with table_lock(root):
        _clear_leftovers(root, retain_s)
        run = root / STAGING / uuid.uuid4().hex
        staged: list[tuple[Path, Path | None]] = []
        for partition in sorted(p for p in root.glob("arrival_date=*") if p.is_dir()):
            table = rewrite(partition, data_files(partition))
            if table is None:
                continue
            if not table.num_rows:
                staged.append((partition, None))
                continue
            target = run / "data" / partition.relative_to(root)
            target.mkdir(parents=True)
            pq.write_table(table, target / f"part-00000-{uuid.uuid4().hex}.parquet")
            staged.append((partition, target))
        _kill_point("staged")
        replaced = False
        for number, (partition, version) in enumerate(staged, start=1):
            if version is None:
                replaced |= _remove_except(partition, set(), run)
            else:
                replaced |= _swap_in(version, partition, run)
            done.append(partition)
            _kill_point(f"swapped-{number}")
        _kill_point("swapped")
        if run.exists():
            _retire(run, retain_s if replaced else 0)
    return done


def clear_partitions(root: Path, partitions: tuple[Path, ...], retain_s: float = RETAIN_REPLACED_S) -> None:
    """Delete whole partitions; each is renamed aside first, so none is ever seen half-deleted, and kept
    retired as `overwrite_partitions` keeps a replaced version."""
    with table_lock(root):
        _clear_leftovers(root, retain_s)
        run = root / STAGING / uuid.uuid4().hex
        if any([_remove_except(partition, set(), run) for partition in partitions]):
            _retire(run, retain_s)


def clear_replaced(root: Path) -> None:
    """Delete the versions of `root`'s partitions that writes replaced and kept for their readers (see
    `overwrite_partitions`), now: for an erasure, no old copy may stay. Call it holding `table_lock(root)`."""
    _clear_leftovers(root, 0)


def clear_every_replaced(lake: Path) -> list[Path]:
    """`clear_replaced` for every table under `lake` that kept replaced versions, each under its lock: after
    an erasure's rebuild, the versions the rebuild replaced still hold the person's rows. The tables
    cleared."""
    cleared = []
    for staging in sorted(lake.rglob(STAGING)):
        if staging.is_dir() and any(staging.iterdir()):
            with table_lock(staging.parent):
                clear_replaced(staging.parent)
            cleared.append(staging.parent)
    return cleared


def _kill_point(point: str) -> None:
    """Fault injection for the tests of a kill inside the commit: with MLOPS_LAKE_KILL_AT=<point> (staged,
    swapped-<n>, swapped, aside) the process kills itself there, as an OOM kill or a lost node would."""
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _leaves(staged_root: Path, partition_by: list[str]) -> list[Path]:
    """The partition folders Spark wrote (`a=1/b=2` for two columns), in order."""
    level = [staged_root]
    for column in partition_by:
        level = [
            child
            for parent in level
            for child in sorted(parent.iterdir())
            if child.is_dir() and child.name.startswith(f"{column}=")
        ]
    return level


def _swap_in(staged: Path, live: Path, run: Path) -> bool:
    """Put the staged partition in place of the live one in one step. The old version is left at the staged
    path (retired with the staging folder). A partition that did not exist is a plain rename. Whether an
    old version was replaced."""
    if not live.exists():
        live.parent.mkdir(parents=True, exist_ok=True)
        os.rename(staged, live)
        return False
    if not _exchange(staged, live):
        _swap_by_renames(staged, live, run)
    return True


def _swap_by_renames(staged: Path, live: Path, run: Path) -> None:
    """The swap where the filesystem cannot exchange (NFS, some FUSE filesystems): two renames, with a
    journal so that the next write puts the old version back if a kill falls between them (`_recover`).
    Readers may see the partition missing for that instant."""
    root, aside = run.parent.parent, staged.with_name(staged.name + ".old")
    journal = {"live": str(live.relative_to(root)), "aside": str(aside.relative_to(root))}
    write_json(run / "swap.json", journal)
    os.rename(live, aside)
    _kill_point("aside")
    os.rename(staged, live)
    (run / "swap.json").unlink()


def _exchange(first: Path, second: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2 RENAME_EXCHANGE); False where the filesystem, kernel
    or C library cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(error, f"cannot exchange {second} with its new version {first}: {os.strerror(error)}")


def _remove_except(partition: Path, keep: set[Path], run: Path) -> bool:
    """Delete `partition`, except the partitions in `keep` below it: each is renamed into the staging
    folder (atomic), and goes with it. Whether anything was removed."""
    if partition in keep or not partition.exists():
        return False
    if any(partition in k.parents for k in keep):
        return any([_remove_except(child, keep, run) for child in sorted(partition.iterdir())])
    removed = run / "removed"
    removed.mkdir(parents=True, exist_ok=True)
    os.rename(partition, removed / uuid.uuid4().hex)
    return True


def _retire(run: Path, retain_s: float) -> None:
    """Keep a finished write's staging folder (the versions it replaced) for readers that opened them before
    the swap; its name says when, for `_clear_leftovers`. With no retention it goes at once."""
    if retain_s <= 0:
        shutil.rmtree(run)
    else:
        os.rename(run, run.with_name(f"{RETIRED}{time.time_ns()}-{run.name}"))


def _retired_at(run: Path) -> float | None:
    """When a retired staging folder was retired (seconds since the epoch); None for any other folder."""
    stamp = run.name.removeprefix(RETIRED).partition("-")[0]
    return int(stamp) / 1e9 if run.name.startswith(RETIRED) and stamp.isdigit() else None


def _clear_leftovers(root: Path, retain_s: float) -> None:
    """Delete what killed writes left: staging folders (after putting back an old version a two-rename swap
    had moved aside) and Spark's own staging folders of writes made before the staging root existed; and
    the retired folders of finished writes once they are `retain_s` old."""
    now = time.time()
    for run in sorted((root / STAGING).glob("*")):
        retired = _retired_at(run)
        if retired is None:
            _recover(root, run)
        elif now - retired < retain_s:
            continue
        shutil.rmtree(run)
    for leftover in [*root.glob(".spark-staging-*"), *root.glob("_temporary")]:
        shutil.rmtree(leftover, ignore_errors=True)


def _recover(root: Path, run: Path) -> None:
    """A two-rename swap killed between its renames left the live partition missing and the old version
    aside in `run`: put it back."""
    journal = read_json(run / "swap.json")
    if journal is None:
        return
    live, aside = root / journal["live"], root / journal["aside"]
    if not live.exists() and aside.is_dir():
        live.parent.mkdir(parents=True, exist_ok=True)
        os.rename(aside, live)


def read_partitions(
    spark: SparkSession, root: Path, days: list[date], schema: StructType | str | None = None
) -> DataFrame | None:
    """The arrival dates of a table that exist among `days` (None if none), `arrival_date` restored. With
    the table's `schema` (partition column included) Spark reads no file to learn it: a read of a small
    date is otherwise a Spark job of its own (benchmarks/spark_jobs.py)."""
    paths = [str(Tables.partition(root, d)) for d in days if Tables.partition(root, d).is_dir()]
    return _reader(spark, root, schema).parquet(*paths) if paths else None


def read_partition(
    spark: SparkSession, root: Path, day: date, schema: StructType | str | None = None
) -> DataFrame:
    """One arrival date of a table, with `arrival_date` restored from the path (`schema`: as above)."""
    return _reader(spark, root, schema).parquet(str(Tables.partition(root, day)))


def _reader(spark: SparkSession, root: Path, schema: StructType | str | None):
    reader = spark.read.option("basePath", str(root))
    return reader if schema is None else reader.schema(schema)


def data_files(partition: Path) -> list[Path]:
    """The Parquet files a reader of `partition` reads: below it, none under a hidden or Spark-private
    name (staging, retired versions, checksums, _SUCCESS)."""
    if not partition.is_dir():
        return []
    return sorted(
        path
        for path in partition.rglob("*.parquet")
        if not any(part.startswith((".", "_")) for part in path.relative_to(partition).parts)
    )


def read_arrow(partition: Path, columns: list[str]):
    """Columns of a partition's rows as one Arrow table (None for a partition with no files): for the
    small tables whose counts a step records, read without a Spark job."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = data_files(partition)
    return pa.concat_tables([pq.read_table(path, columns=columns) for path in files]) if files else None


def parquet_rows(partition: Path) -> int:
    """The rows in a partition as written: the sum of its files' footers (no Spark job, no data read); 0
    for a partition that does not exist. The reconciliation counts state what is on disk."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(path).num_rows for path in data_files(partition))


def value_counts(partition: Path, column: str) -> dict[str | None, int]:
    """How many rows of a partition hold each value of one of its columns (read with Arrow, that column
    only); empty for a partition that does not exist. For small tables such as a date's quarantine."""
    import pyarrow.parquet as pq

    counts: dict[str | None, int] = {}
    for path in data_files(partition):
        for entry in pq.read_table(path, columns=[column]).column(column).value_counts().to_pylist():
            counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
    return counts


def write_json(path: Path, payload: dict) -> None:
    """Write a JSON record atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(temp, path)


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None
