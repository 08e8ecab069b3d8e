"""Pure transforms of the ingestion: DataFrames in, DataFrames out. No paths, sessions or clock.

Every input line is classified exactly once: it becomes a typed bronze row, or a quarantine row with one
reason code. Reasons are checked in this order and the first that applies wins:

| reason           | meaning                                                                      |
|------------------|------------------------------------------------------------------------------|
| malformed        | unparseable: fewer CSV tokens than the header, unbalanced quotes, not JSON   |
| extra_column     | more CSV tokens than the header, or JSON keys outside the contract          |
| missing_required | a required field is null or blank                                            |
| wrong_type       | amount is not a decimal number, or event_timestamp not an ISO 8601 instant   |
| out_of_range     | amount <= 0 or above the maximum; event date outside the arrival window      |
| invalid_value    | currency, country, channel or merchant_category outside the allowed values   |

Silver keeps the first copy of each transaction_id in (source_file, line_number) order: producers resend
identical rows on retry, so the first one is the original. The later copies go to quarantine with reason
`duplicate` (stage `silver`) and their full record, so a resend with different content stays visible.
"""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType

from pipelines.contracts import (
    AMOUNT_MAX,
    CHANNELS,
    COUNTRIES,
    CURRENCY_PER_USD,
    LABEL_COLUMNS,
    MERCHANT_CATEGORIES,
    REQUIRED_TRANSACTION_COLUMNS,
    TRANSACTION_COLUMNS,
)
from pipelines.ingest.schemas import AMOUNT_TYPE, BRONZE_TRANSACTIONS, QUARANTINE, SILVER_TRANSACTIONS

TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX"
ROW_REASONS = ("malformed", "extra_column", "missing_required", "wrong_type", "out_of_range", "invalid_value")
ALLOWED_VALUES = {
    "currency": tuple(CURRENCY_PER_USD),
    "country": COUNTRIES,
    "channel": CHANNELS,
    "merchant_category": MERCHANT_CATEGORIES,
}
# A quoted CSV field, with "" as an escaped quote inside it.
_QUOTED_FIELD = r'"([^"]|"")*"'


def parse_csv_lines(
    lines: DataFrame, header: list[str], columns: tuple[str, ...] = TRANSACTION_COLUMNS
) -> DataFrame:
    """Split CSV lines (`value`, without the header) into string columns named by `header`.

    Spark's CSV parser pads short rows with nulls and drops extra tokens without a word, so the token count
    is checked on the raw line first (quoted fields count as one token).
    """
    tokens = F.size(F.split(F.regexp_replace("value", _QUOTED_FIELD, "Q"), ",", -1))
    quote_chars = F.length("value") - F.length(F.regexp_replace("value", '"', ""))
    ddl = ", ".join(f"`{name}` STRING" for name in header)
    parsed = F.from_csv(F.col("value"), ddl, {"mode": "PERMISSIVE"})
    parse_error = (
        F.when((F.col("value") == "") | (quote_chars % 2 == 1) | (tokens < len(header)), F.lit("malformed"))
        .when(tokens > len(header), F.lit("extra_column"))
        .otherwise(F.lit(None).cast(StringType()))
    )
    return _parsed(lines, [parsed[name].alias(name) for name in columns], parse_error)


def parse_json_lines(lines: DataFrame, columns: tuple[str, ...] = TRANSACTION_COLUMNS) -> DataFrame:
    """Read JSON Lines (`value`) into string columns; numbers keep their JSON text."""
    record = F.from_json(F.col("value"), MapType(StringType(), StringType()))
    unknown_keys = F.filter(F.map_keys(record), lambda k: ~k.isin(*columns))
    parse_error = (
        F.when(record.isNull(), F.lit("malformed"))
        .when(F.size(unknown_keys) > 0, F.lit("extra_column"))
        .otherwise(F.lit(None).cast(StringType()))
    )
    return _parsed(
        lines, [F.when(record.isNotNull(), record[name]).alias(name) for name in columns], parse_error
    )


def _parsed(lines: DataFrame, values: list[Column], parse_error: Column) -> DataFrame:
    """The parsers' common output: string values, the parse error, and where the raw line came from."""
    return lines.select(
        *values,
        parse_error.alias("parse_error"),
        F.col("value").alias("raw_record"),
        "source_file",
        "line_number",
    )


def classify(raw: DataFrame, arrival: date, late_days: int) -> DataFrame:
    """Type the string columns and give each row its reason (null for a clean row) and a detail."""
    amount = F.expr(f"try_cast(amount AS {AMOUNT_TYPE.simpleString()})")
    event_ts = F.try_to_timestamp(F.col("event_timestamp"), F.lit(TIMESTAMP_FORMAT))
    event_date = F.to_date(event_ts)
    earliest = arrival - timedelta(days=late_days)

    missing = [(F.col(c).isNull() | (F.trim(F.col(c)) == ""), c) for c in REQUIRED_TRANSACTION_COLUMNS]
    wrong_type = [
        (amount.isNull(), F.concat(F.lit("amount is not a decimal number: "), F.col("amount"))),
        (event_ts.isNull(), F.concat(F.lit("event_timestamp is not ISO 8601: "), F.col("event_timestamp"))),
    ]
    out_of_range = [
        (
            (amount <= 0) | (amount > AMOUNT_MAX),
            F.concat(F.lit("amount "), amount.cast("string"), F.lit(f" outside (0, {AMOUNT_MAX:g}]")),
        ),
        (
            (event_date < F.lit(earliest)) | (event_date > F.lit(arrival)),
            F.concat(
                F.lit("event date "), event_date.cast("string"), F.lit(f" outside [{earliest}, {arrival}]")
            ),
        ),
    ]
    invalid = [
        (F.col(c).isNotNull() & ~F.col(c).isin(*allowed), F.concat(F.lit(f"{c} not allowed: "), F.col(c)))
        for c, allowed in ALLOWED_VALUES.items()
    ]
    reason: Column = F.when(F.col("parse_error").isNotNull(), F.col("parse_error"))
    detail: Column = F.when(F.col("parse_error").isNotNull(), F.lit(None).cast(StringType()))
    for condition, column in missing:
        reason = reason.when(condition, F.lit("missing_required"))
        detail = detail.when(condition, F.lit(f"{column} is null or blank"))
    for name, checks in (
        ("wrong_type", wrong_type),
        ("out_of_range", out_of_range),
        ("invalid_value", invalid),
    ):
        for condition, text in checks:
            reason = reason.when(condition, F.lit(name))
            detail = detail.when(condition, text)
    return raw.select(
        *(F.col(c) for c in TRANSACTION_COLUMNS if c not in ("amount", "event_timestamp")),
        amount.alias("amount"),
        event_ts.alias("event_timestamp"),
        reason.alias("reason"),
        detail.alias("detail"),
        "raw_record",
        "source_file",
        "line_number",
    )


def to_bronze(classified: DataFrame, arrival: date, run_id: str) -> DataFrame:
    return classified.where(F.col("reason").isNull()).select(
        *(
            F.col(f.name).cast(f.dataType).alias(f.name)
            for f in BRONZE_TRANSACTIONS.fields
            if f.name not in ("run_id", "arrival_date")
        ),
        F.lit(run_id).alias("run_id"),
        F.lit(arrival).alias("arrival_date"),
    )


def rejection_columns(run_id: str, arrival: date) -> list[Column | str]:
    """What a quarantine row keeps besides its stage and reason: detail, location, raw record, run."""
    return [
        "detail",
        "source_file",
        "line_number",
        "raw_record",
        "transaction_id",
        F.lit(run_id).alias("run_id"),
        F.lit(arrival).alias("arrival_date"),
    ]


def to_quarantine(classified: DataFrame, arrival: date, run_id: str) -> DataFrame:
    return classified.where(F.col("reason").isNotNull()).select(
        F.lit("bronze").alias("stage"), "reason", *rejection_columns(run_id, arrival)
    )


def deduplicate(bronze: DataFrame, run_id: str) -> tuple[DataFrame, DataFrame]:
    """(silver rows, quarantine rows for the removed copies). The first copy by file and line wins."""
    order = Window.partitionBy("transaction_id").orderBy("source_file", "line_number")
    ranked = bronze.select(
        "*",
        F.row_number().over(order).alias("_copy"),
        F.first(F.concat_ws(":", "source_file", F.col("line_number").cast("string")))
        .over(order)
        .alias("_first"),
    )
    silver = ranked.where(F.col("_copy") == 1).select(
        *(F.col(f.name) for f in SILVER_TRANSACTIONS.fields if f.name != "event_date"),
        F.to_date("event_timestamp").alias("event_date"),
    )
    business = list(TRANSACTION_COLUMNS)
    duplicates = ranked.where(F.col("_copy") > 1).select(
        F.lit("silver").alias("stage"),
        F.lit("duplicate").alias("reason"),
        F.concat(F.lit("transaction_id first seen at "), F.col("_first")).alias("detail"),
        "source_file",
        "line_number",
        F.to_json(F.struct(*business)).alias("raw_record"),
        "transaction_id",
        F.lit(run_id).alias("run_id"),
        "arrival_date",
    )
    return silver.select(*SILVER_TRANSACTIONS.fieldNames()), duplicates.select(*QUARANTINE.fieldNames())


def classify_labels(raw: DataFrame, arrival: date, late_days: int) -> DataFrame:
    """Chargebacks: `transaction_id`, `is_fraud` (0 or 1), `label_timestamp` reported on the arrival date
    (or up to `late_days` before it). Same reason codes as transactions."""
    is_fraud = F.expr("try_cast(is_fraud AS INT)")
    label_ts = F.try_to_timestamp(F.col("label_timestamp"), F.lit(TIMESTAMP_FORMAT))
    label_date = F.to_date(label_ts)
    earliest = arrival - timedelta(days=late_days)
    reason: Column = F.when(F.col("parse_error").isNotNull(), F.col("parse_error"))
    detail: Column = F.when(F.col("parse_error").isNotNull(), F.lit(None).cast(StringType()))
    checks = [
        *(
            (F.col(c).isNull() | (F.trim(F.col(c)) == ""), "missing_required", F.lit(f"{c} is null or blank"))
            for c in LABEL_COLUMNS
        ),
        (is_fraud.isNull(), "wrong_type", F.concat(F.lit("is_fraud is not an integer: "), F.col("is_fraud"))),
        (
            label_ts.isNull(),
            "wrong_type",
            F.concat(F.lit("label_timestamp is not ISO 8601: "), F.col("label_timestamp")),
        ),
        (
            ~is_fraud.isin(0, 1),
            "out_of_range",
            F.concat(F.lit("is_fraud must be 0 or 1: "), F.col("is_fraud")),
        ),
        (
            (label_date < F.lit(earliest)) | (label_date > F.lit(arrival)),
            "out_of_range",
            F.concat(
                F.lit("label date "), label_date.cast("string"), F.lit(f" outside [{earliest}, {arrival}]")
            ),
        ),
    ]
    for condition, name, text in checks:
        reason = reason.when(condition, F.lit(name))
        detail = detail.when(condition, text)
    return raw.select(
        "transaction_id",
        is_fraud.alias("is_fraud"),
        label_ts.alias("label_timestamp"),
        reason.alias("reason"),
        detail.alias("detail"),
        "raw_record",
        "source_file",
        "line_number",
    )
