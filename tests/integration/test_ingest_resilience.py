"""A silver write killed midway leaves the old partition whole; the same job on a Spark standalone cluster
gives the same silver as local mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import date
from pathlib import Path

from pyspark.sql import functions as F

from core.settings import Settings
from pipelines.ingest import job as ingest
from pipelines.lake import Tables, read_partition
from pipelines.synthetic.landing import GenerateRequest, generate_landing
from tests.conftest import wait_for

MLOPS = str(Path(sys.executable).with_name("mlops"))
DAY = date(2026, 1, 5)


def _env(home: Path, **more: str) -> dict[str, str]:
    return {**os.environ, "MLOPS_HOME": str(home), "MLOPS_SPARK_DRIVER_MEMORY": "1g", **more}


def _ingest(home: Path, **env: str) -> dict:
    done = subprocess.run(
        [MLOPS, "ingest", "--date", DAY.isoformat(), "--json"],
        env=_env(home, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _digest(spark, home: Path) -> tuple[int, int]:
    """Row count and an order-independent checksum of every column of the date's silver partition."""
    df = read_partition(spark, Tables(home / "lake").silver, DAY)
    checksum = F.sum(F.xxhash64(*df.columns).cast("decimal(38,0)"))
    row = df.select(F.count("*").alias("n"), checksum.alias("h")).first()
    return row.n, row.h


def test_a_silver_write_killed_midway_leaves_the_previous_partition_whole(spark, tmp_path):
    home = tmp_path / "home"
    generate_landing(
        GenerateRequest(start=DAY, days=1, rows_per_day=200_000, seed=4, landing=home / "landing", faults={})
    )
    # The set-up and the rerun in this process (its Spark session); only the killed writer needs its own.
    settings = Settings(home=home, spark_driver_memory="1g")
    ingest.ingest_to_bronze(settings, DAY, "setup")
    ingest.build_silver(settings, DAY, "setup")
    before = _digest(spark, home)
    silver_root = Tables(home / "lake").silver

    writer = subprocess.Popen(
        [MLOPS, "ingest", "--date", DAY.isoformat(), "--step", "build_silver"],
        env=_env(home),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    # Kill while a task is still writing its attempt file, well before the job commits.
    wait_for(
        lambda: any(silver_root.glob(".staging/*/data/_temporary/*/_temporary/attempt_*/**/*.parquet")),
        300,
        "a task to start writing its output",
    )
    os.killpg(writer.pid, signal.SIGKILL)  # the Python driver and its JVM
    writer.wait(timeout=30)
    left = set(silver_root.glob(".staging/*"))
    assert left, "the job committed before the kill; nothing was tested"
    assert _digest(spark, home) == before  # readers see the old partition, whole

    after = ingest.build_silver(settings, DAY, "rerun")
    assert _digest(spark, home) == before
    assert not left & set(silver_root.glob(".staging/*")), "the rerun removes what the killed job left"
    assert after["rows_silver"] == before[0]


def test_a_standalone_cluster_gives_the_same_silver_as_local_mode(spark, spark_standalone, tmp_path):
    landing = tmp_path / "landing"
    generate_landing(
        GenerateRequest(
            start=DAY, days=1, rows_per_day=20_000, seed=6, landing=landing, faults={}, rows_per_file=7000
        )
    )
    # Local mode in this process's own session; the cluster run in a process of its own (another profile).
    local = ingest.ingest(Settings(home=tmp_path / "local", landing_dir=landing), DAY, "local")
    cluster = _ingest(
        tmp_path / "cluster",
        MLOPS_LANDING_DIR=str(landing),
        MLOPS_PROFILE="cluster",
        MLOPS_CLUSTER__SPARK_MASTER=spark_standalone,
        # the cluster's key is given (a mounted Secret); the same as local mode's, so pseudonyms are equal
        MLOPS_PRIVACY__KEY_FILE=str(tmp_path / "local" / "secrets" / "pseudonym.key"),
    )
    keys = ("rows_in", "rows_bronze", "rows_quarantined", "rows_silver", "duplicates_removed")
    assert {k: cluster[k] for k in keys} == {k: local[k] for k in keys}
    assert cluster["status"] == local["status"] == "ok"
    assert _digest(spark, tmp_path / "cluster") == _digest(spark, tmp_path / "local")
    assert local["rows_silver"] > 0
