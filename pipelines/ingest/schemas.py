"""Spark schemas of the transaction tables: module constants, never inferred."""

from __future__ import annotations

from pyspark.sql.types import (
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

AMOUNT_TYPE = DecimalType(12, 2)

BRONZE_TRANSACTIONS = StructType(
    [
        StructField("transaction_id", StringType(), nullable=False),
        StructField("customer_id", StringType(), nullable=False),
        StructField("merchant_id", StringType(), nullable=False),
        StructField("amount", AMOUNT_TYPE, nullable=False),
        StructField("currency", StringType(), nullable=False),
        StructField("country", StringType(), nullable=True),
        StructField("channel", StringType(), nullable=True),
        StructField("merchant_category", StringType(), nullable=True),
        StructField("event_timestamp", TimestampType(), nullable=False),
        StructField("source_file", StringType(), nullable=False),
        StructField("line_number", LongType(), nullable=False),
        StructField("run_id", StringType(), nullable=False),
        StructField("arrival_date", DateType(), nullable=False),
    ]
)

SILVER_TRANSACTIONS = StructType(
    [f for f in BRONZE_TRANSACTIONS.fields if f.name != "run_id"]
    + [StructField("event_date", DateType(), nullable=False)]
)

# A chargeback's first copy as ingest_labels writes it (pipelines/ingest/job.py `_write_labels`).
SILVER_LABELS = StructType(
    [
        StructField("transaction_id", StringType(), nullable=True),
        StructField("is_fraud", IntegerType(), nullable=True),
        StructField("label_timestamp", TimestampType(), nullable=True),
        StructField("source_file", StringType(), nullable=False),
        StructField("line_number", LongType(), nullable=True),
        StructField("arrival_date", DateType(), nullable=False),
    ]
)

QUARANTINE = StructType(
    [
        StructField("stage", StringType(), nullable=False),
        StructField("reason", StringType(), nullable=False),
        StructField("detail", StringType(), nullable=True),
        StructField("source_file", StringType(), nullable=False),
        StructField("line_number", LongType(), nullable=False),
        StructField("raw_record", StringType(), nullable=True),
        StructField("transaction_id", StringType(), nullable=True),
        StructField("run_id", StringType(), nullable=False),
        StructField("arrival_date", DateType(), nullable=False),
    ]
)
