"""The SparkSession of this process, built from the settings. Only the I/O layer calls it.

Two ways to run: a driver in this process (`mlops` commands, tests, `dvc repro`), or a client of a shared
Spark Connect server (`MLOPS_SPARK_REMOTE=sc://host:port`; `make up` starts one and points the Airflow tasks
at it). Spark and GX code is the same for both: it uses the DataFrame API only. A driver of its own costs a
task a JVM start and a cold JIT, most of a small date's time; a client session on a warm server costs a
fraction of that (measured: see docs/benchmarks.md).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from core.settings import Settings

CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
CONNECT_APP_NAME = "mlops-spark-connect"
HUGE_METHODS_COMPILED = "-XX:-DontCompileHugeMethods"


def driver_conf(settings: Settings) -> dict[str, str]:
    """Static settings of a driver: fixed when its JVM starts (a Connect server gets them on its command
    line, scripts/up.sh)."""
    java_options = " ".join(filter(None, (HUGE_METHODS_COMPILED, settings.spark_java_options.strip())))
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.memory": settings.spark_driver_memory,
        # The v1 committer moves task output only at job commit: readers never see a half-written partition.
        "spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version": "1",
        # The code Spark generates for a stage of many expressions (ingestion's row rules) is one Java method
        # above HotSpot's 8000-byte limit for compiling it: left to the interpreter, such a stage ran several
        # times slower (measured: docs/benchmarks.md).
        "spark.driver.extraJavaOptions": java_options,
        "spark.executor.extraJavaOptions": java_options,
    }
    if settings.spark_master.startswith("spark://"):
        conf["spark.driver.host"] = settings.cluster.spark_driver_host
    return conf


def connect_server_args(
    settings: Settings, *, host: str | None = None, port: int | None = None, extra_conf: Sequence[str] = ()
) -> list[str]:
    """spark-submit's arguments for the Spark Connect server that is the driver of every task: the driver's
    static settings (`driver_conf`) on the settings' master, listening on `host`:`port` when given, then
    `extra_conf` ("spark.key=value", e.g. the executors' memory, which sizes go with the cluster's Workers).
    One source for `make up` (scripts/up.sh) and the cluster's Deployment (`mlops spark-connect`)."""
    conf = driver_conf(settings)
    if host is not None:
        conf["spark.connect.grpc.binding.address"] = host
    if port is not None:
        conf["spark.connect.grpc.binding.port"] = str(port)
    for item in extra_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("spark.") or not value:
            raise ValueError(f"--conf {item!r}: give a Spark setting as spark.<name>=<value>")
        conf[key] = value
    args = ["--class", CONNECT_SERVER_CLASS, "--name", CONNECT_APP_NAME, "--master", settings.spark_master]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def spark_submit() -> str:
    """The spark-submit of the pyspark this process imports (its package carries Spark's scripts and jars)."""
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def session_conf(settings: Settings) -> dict[str, str]:
    """Settings of each session (SQL settings: a Spark Connect client sets them on its own session)."""
    return {
        "spark.sql.shuffle.partitions": str(settings.spark_shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        # Rerunning a date replaces exactly that date's partition.
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.sql.parquet.compression.codec": "zstd",
        # Standard UTC-adjusted micros, not legacy INT96: Arrow and Feast read them as timestamp[us, UTC].
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        "spark.sql.ansi.enabled": "true",
    }


@contextlib.contextmanager
def adaptive_execution_off(spark: SparkSession):
    """Adaptive execution off for the queries run inside: for a global aggregation over one scan (GX's metric
    queries, the split counts of ingestion) it has nothing to re-plan, yet submits each shuffle stage, and a
    persisted input's materialization, as a Spark job of its own (three jobs for a query that is one without
    it: docs/benchmarks.md, "Spark jobs per step"). The session's setting is restored after."""
    key = "spark.sql.adaptive.enabled"
    before = spark.conf.get(key, "true") or "true"
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def spark_session(settings: Settings) -> SparkSession:
    """Get or create the session for the active profile: a client of the Spark Connect server when
    `spark_remote` is set, else a driver on local[*] or the cluster's master."""
    from pyspark.sql import SparkSession

    if settings.spark_remote:
        builder = SparkSession.builder.remote(settings.spark_remote)
        for key, value in session_conf(settings).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        _release_at_exit(session)
        return session
    # Python workers (the pseudonym UDF of ingestion, core/pseudonym.py) run this environment's Python, which
    # has pandas and pyarrow; the plain `python3` on PATH that pyspark takes by default may not. A remote
    # cluster whose executors keep Python elsewhere names it with PYSPARK_PYTHON.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(settings.spark_master).appName("mlops-fraud")
    for key, value in {**driver_conf(settings), **session_conf(settings)}.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


@functools.cache
def _release_at_exit(session: SparkSession) -> None:
    """Release the session on the server when this process ends (what it cached goes with it), instead of
    leaving it to the server's idle timeout. Once per session: getOrCreate returns the same one."""
    atexit.register(_release, session)


def _release(session: SparkSession) -> None:
    # The server may be gone already: nothing is left to release then.
    with contextlib.suppress(Exception):
        session.stop()
