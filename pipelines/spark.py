"""The SparkSession of this process, built from the settings. Only the I/O layer calls it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mlops.settings import Settings


def spark_session(settings: Settings) -> SparkSession:
    """Get or create the session for the active profile (local[*] or the cluster's master)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName("mlops-fraud")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        # Rerunning a date replaces exactly that date's partition; the v1 committer moves task output
        # only at job commit, so readers never see a half-written partition.
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.hadoop.mapreduce.fileoutputcommitter.algorithm.version", "1")
        .config("spark.sql.parquet.compression.codec", "zstd")
        # Standard UTC-adjusted micros, not legacy INT96: Arrow and Feast read them as timestamp[us, UTC].
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.ansi.enabled", "true")
    )
    if settings.spark_master.startswith("spark://"):
        builder = builder.config("spark.driver.host", settings.cluster.spark_driver_host)
    return builder.getOrCreate()
