"""Pure transforms of the ingestion: DataFrames in, DataFrames out. No paths, sessions or clock.

Every input line is classified exactly once: it becomes a typed bronze row, or a quarantine row with one
reason code and a detail naming the column, the value and the rule. The row rules are derived from the
table's data contract (`pipelines/contracts.py`), the same one the GX suites are generated from. Reasons
are checked in this order and the first that applies wins:

| reason           | meaning                                                                      |
|------------------|------------------------------------------------------------------------------|
| malformed        | unparseable: not UTF-8, fewer CSV tokens than the header, unbalanced quotes, |
|                  | not a JSON object, a JSON key sent twice                                     |
| extra_column     | more CSV tokens than the header, or JSON keys outside the contract          |
| missing_required | a required field is null or blank                                            |
| wrong_type       | not the contract's type, or not exactly: a decimal with more decimal places  |
|                  | than the scale or more integer digits than precision - scale (never rounded),|
|                  | a timestamp that is not ISO 8601 with an offset or has non-zero digits past  |
|                  | the microsecond, an integer that is not plain digits                         |
| out_of_range     | a number outside the contract's min/max; a timestamp whose UTC date is       |
|                  | outside the arrival window [arrival - late days, arrival]                    |
| invalid_value    | a string too long, off its pattern (ids), or outside the allowed values      |

Values are taken as sent: no trimming, no case folding. ` 12.5`, `1,000.00`, `EUR `, an id with a trailing
space, a Unicode look-alike or a control character are quarantined, never cleaned. Decimals are plain
notation with an optional sign and exponent (`+3`, `-0`, `1e3` are numbers; `.5`, `5.` are not); a JSON
number keeps the text it was sent as (Spark would read it through a double). A byte-order mark at the start
of a JSON Lines file is not data and is skipped (a CSV file's first line is its header).

Silver keeps the first copy of each transaction_id by (arrival_date, source_file, line_number), looking
back `lookback` arrival dates: producers resend identical rows on retry, also on a later day, so the first
one is the original. The later copies go to quarantine with reason `duplicate` (stage `silver`), a detail
naming the first copy and their full record, so a resend with different content stays visible.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StringType

from core import pseudonym
from core.pseudonym import Pseudonymiser
from pipelines.contracts import (
    DECIMAL_TEXT,
    INTEGER_TEXT,
    LABELS_CONTRACT,
    TRANSACTION_COLUMNS,
    TRANSACTIONS_CONTRACT,
    FieldContract,
    TableContract,
)
from pipelines.ingest.schemas import BRONZE_TRANSACTIONS, QUARANTINE, SILVER_TRANSACTIONS

# How a contract timestamp reads: up to 9 fractional digits; the contract's pattern has already refused
# non-zero digits past the 6th (Spark timestamps hold microseconds), so nothing is rounded. Ingestion reads
# the values with Spark's cast, which agrees with this format on every value the pattern lets through.
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSSSSS]XXX"
KEY_MASK = "_key_mask"  # parse_json_lines: the keys of each record, as bits (json_key_mask)
OTHER_KEYS = "(a key outside the contract)"
ROW_REASONS = ("malformed", "extra_column", "missing_required", "wrong_type", "out_of_range", "invalid_value")
ALLOWED_VALUES = {f.name: f.allowed for f in TRANSACTIONS_CONTRACT.fields if f.allowed is not None}
_NUMERIC_FIELDS = {
    f.name
    for c in (TRANSACTIONS_CONTRACT, LABELS_CONTRACT)
    for f in c.fields
    if f.kind in ("decimal", "integer")
}
# A quoted CSV field, with "" as an escaped quote inside it.
_QUOTED_FIELD = r'"([^"]|"")*"'
# A JSON number, as the producer wrote it.
_JSON_NUMBER = r"(-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*[,}]"


def parse_csv_lines(
    lines: DataFrame, header: list[str], columns: tuple[str, ...] = TRANSACTION_COLUMNS
) -> DataFrame:
    """Split CSV lines (`value`, without the header) into string columns named by `header`.

    Spark's CSV parser pads short rows with nulls and drops extra tokens without a word, so the token count
    is checked on the raw line first (quoted fields count as one token).
    """
    value = F.col("value")
    # Most lines have no quote: they are split on commas, which gives the same fields as Spark's CSV
    # parser there (an empty field is null) at a fraction of its cost (tests/data/test_ingest_transforms.py
    # compares the two). A line with a quote goes through the parser, and its quoted fields collapse to one
    # character before the commas are counted.
    quoted = value.contains('"')
    pieces = F.split(F.when(quoted, F.regexp_replace(value, _QUOTED_FIELD, "Q")).otherwise(value), ",", -1)
    ddl = ", ".join(f"`{name}` STRING" for name in header)
    # RFC 4180 quoting, as Python's csv and pandas write it: "" inside a quoted field is one quote.
    parser = F.from_csv(value, ddl, {"mode": "PERMISSIVE", "escape": '"'})
    counted = lines.select(
        "*",
        quoted.alias("_quoted"),
        pieces.alias("_pieces"),
        F.when(quoted, parser).alias("_parsed"),
        F.when(quoted, F.length(value) - F.length(F.replace(value, F.lit('"'), F.lit(""))))
        .otherwise(F.lit(0))
        .alias("_quotes"),
    )
    tokens, quote_chars = F.size("_pieces"), F.col("_quotes")

    def field(name: str) -> Column:
        piece = F.get(F.col("_pieces"), header.index(name))
        return F.when(F.col("_quoted"), F.col("_parsed")[name]).otherwise(F.when(piece != "", piece))

    fields = F.concat(tokens.cast("string"), F.lit(f" fields; the header has {len(header)}"))
    failure = _first_failure(
        [
            _not_utf8(),
            ("malformed", value == "", F.lit("empty line")),
            (
                "malformed",
                quote_chars % 2 == 1,
                F.concat(
                    F.lit("unbalanced quotes: "),
                    quote_chars.cast("string"),
                    F.lit(" quote characters; a quoted field must end on its line (a line break inside "),
                    F.lit("a quoted field is not supported)"),
                ),
            ),
            ("malformed", tokens < len(header), fields),
            ("extra_column", tokens > len(header), fields),
        ]
    )
    return _parsed(lines, counted, [field(name).alias(name) for name in columns], failure)


def parse_json_lines(lines: DataFrame, columns: tuple[str, ...] = TRANSACTION_COLUMNS) -> DataFrame:
    """Read JSON Lines (`value`) into string columns. A number keeps the text it was sent as (from_json
    would read it through a double: 10.000000000000000001 would become 10.0)."""
    text = F.when(F.col("line_number") == 1, F.regexp_replace("value", "^\ufeff", "")).otherwise(
        F.col("value")
    )
    record = F.from_json(text, MapType(StringType(), StringType()))
    keys = F.map_keys(record)
    # Array functions, not lambdas: a lambda is interpreted row by row, these are compiled. The listings
    # are built only for the lines that fail.
    contract = F.array(*(F.lit(c) for c in columns))
    unknown_keys = F.array_except(keys, contract)
    repeated_keys = F.array_distinct(F.filter(keys, lambda k: F.size(F.filter(keys, lambda j: j == k)) > 1))
    failure = _first_failure(
        [
            _not_utf8(),
            ("malformed", record.isNull(), F.lit("not a JSON object (JSON Lines: one object per line)")),
            (
                "malformed",
                F.size(F.array_distinct(keys)) < F.size(keys),
                F.concat(F.lit("key(s) sent more than once: "), F.array_join(repeated_keys, ", ")),
            ),
            (
                "extra_column",
                F.size(unknown_keys) > 0,
                F.concat(F.lit("key(s) outside the contract: "), F.array_join(unknown_keys, ", ")),
            ),
        ]
    )

    def value(name: str) -> Column:
        if name not in _NUMERIC_FIELDS:
            return record[name]
        sent = F.regexp_extract(text, f'"{name}"\\s*:\\s*{_JSON_NUMBER}', 1)
        return F.when(record.isNotNull() & (sent != ""), sent).otherwise(record[name])

    values = [F.when(record.isNotNull(), value(name)).alias(name) for name in columns]
    return _parsed(lines, lines, values, failure, json_key_mask(keys, unknown_keys, columns).alias(KEY_MASK))


def json_key_mask(keys: Column, unknown_keys: Column, columns: tuple[str, ...]) -> Column:
    """The keys of a JSON record as bits: bit i for `columns[i]`, the next bit when `unknown_keys` (the
    record's keys outside `columns`, as the parser finds them) is not empty. OR-ed over a file, they tell
    which columns no record of it has (`json_keys_seen`)."""
    bits = [
        F.when(F.array_contains(keys, c), F.lit(1 << i)).otherwise(F.lit(0)) for i, c in enumerate(columns)
    ]
    other = F.size(unknown_keys) > 0
    bits.append(F.when(other, F.lit(1 << len(columns))).otherwise(F.lit(0)))
    return F.coalesce(sum(bits[1:], bits[0]), F.lit(0)).cast("long")


def json_keys_seen(mask: int, columns: tuple[str, ...]) -> set[str]:
    """The keys a `json_key_mask` OR-ed over a file's records stands for: the columns among them, and
    OTHER_KEYS when a record had a key outside them."""
    seen = {c for i, c in enumerate(columns) if mask & (1 << i)}
    return seen | ({OTHER_KEYS} if mask & (1 << len(columns)) else set())


def _not_utf8() -> tuple[str, Column, Column]:
    """Spark reads bytes that are not UTF-8 as they are: such a line is quarantined, never typed."""
    return (
        "malformed",
        ~F.is_valid_utf8("value"),
        F.lit("not UTF-8 text (Latin-1 or another encoding?); re-export the file as UTF-8"),
    )


def _first_failure(checks: list[tuple[str, Column, Column]]) -> tuple[Column, Column]:
    """(reason, detail) of the first check whose condition holds; nulls for a line that parses."""
    (name, condition, text), *rest = checks
    reason, detail = F.when(condition, F.lit(name)), F.when(condition, text)
    for name, condition, text in rest:
        reason, detail = reason.when(condition, F.lit(name)), detail.when(condition, text)
    none = F.lit(None).cast(StringType())
    return reason.otherwise(none), detail.otherwise(none)


def _parsed(
    lines: DataFrame, frame: DataFrame, values: list[Column], failure: tuple[Column, Column], *more: Column
) -> DataFrame:
    """The parsers' common output: string values, the parse error and its detail, the raw line, and every
    other column of `lines` (where the line came from: `source_file`, `line_number` and what the reader
    adds), read from `frame` (`lines` with the parser's helper columns)."""
    return frame.select(
        *values,
        failure[0].alias("parse_error"),
        failure[1].alias("parse_detail"),
        F.col("value").alias("raw_record"),
        *(c for c in lines.columns if c != "value"),
        *more,
    )


def _shown(value: Column) -> Column:
    """A value as JSON text, so a trailing space or a control character is visible in a detail."""
    return F.regexp_extract(F.to_json(F.array(value)), r"^\[(.*)\]$", 1)


@dataclass
class _FieldPlan:
    """How one contract field is judged: helper columns computed in steps (a step may use the helpers of
    the steps before it), the typed value, and the rules (reason, condition, detail), in reason order.

    Every helper is a column of its own, so a value that several rules read (the typed value, a decimal's
    digit counts) is computed once per row: inlined, a rule chain would compute it again in every rule that
    reads it, regexes and timestamp parsing included.
    """

    steps: tuple[dict[str, Column], ...] = field(default_factory=lambda: ({}, {}, {}, {}))
    typed: Column | None = None
    rules: list[tuple[str, Column, Column]] = field(default_factory=list)


def _decimal_parts(text: Column) -> dict[str, Column]:
    """The parts of a DECIMAL_TEXT string that its exact size depends on: computed on the text, since
    Spark's cast to a decimal type rounds to its scale (10.005 -> 10.01)."""
    parts = r"^[+-]?([0-9]+)(?:\.([0-9]+))?(?:[eE]([+-]?[0-9]+))?\z"
    exponent = F.regexp_extract(text, parts, 3)
    return {
        "whole": F.regexp_extract(text, parts, 1),
        "fraction": F.regexp_extract(text, parts, 2),
        "exponent": F.when(exponent != "", exponent.try_cast("int")).otherwise(F.lit(0)),
    }


def _field_plan(f: FieldContract, arrival: date, late_days: int) -> _FieldPlan:
    text = F.col(f.name)
    plan = _FieldPlan()

    def helper(step: int, name: str, value: Column) -> Column:
        plan.steps[step][f"_{f.name}_{name}"] = value
        return F.col(f"_{f.name}_{name}")

    present = text.isNotNull() & (F.trim(text) != "") if f.required else text.isNotNull()
    rules = plan.rules
    if f.required:
        rules.append(("missing_required", ~present, F.lit(f"{f.name} is null or blank")))
    if f.kind == "decimal":
        assert f.precision is not None and f.scale is not None
        integer_places = f.precision - f.scale
        # Most amounts are plain digits with at most `scale` decimals: exact by their shape alone. Only
        # the others (a sign, an exponent, more digits) have their digits counted.
        plain = helper(0, "plain", text.rlike(rf"^[0-9]{{1,{integer_places}}}(\.[0-9]{{1,{f.scale}}})?\z"))
        shape = helper(1, "shape", plain | text.rlike(DECIMAL_TEXT))
        parts = {name: helper(1, name, F.when(~plain, value)) for name, value in _decimal_parts(text).items()}
        digits = F.concat(parts["whole"], parts["fraction"])
        point = F.length(parts["whole"]) + parts["exponent"]  # digits before the decimal point
        significant = F.length(F.regexp_replace(digits, "0+$", ""))
        leading_zeros = F.length(digits) - F.length(F.regexp_replace(digits, "^0+", ""))
        # Null for a plain amount, whose rules below then never apply.
        places = helper(2, "places", F.greatest(significant - point, F.lit(0)))
        integer_digits = helper(2, "integer_digits", F.greatest(point - leading_zeros, F.lit(0)))
        exact = shape & (plain | ((places <= f.scale) & (integer_digits <= integer_places)))
        typed = helper(
            3, "typed", F.when(exact, F.expr(f"try_cast(`{f.name}` AS DECIMAL({f.precision},{f.scale}))"))
        )
        rules += [
            (
                "wrong_type",
                ~shape,
                F.concat(F.lit(f"{f.name} is not a decimal number: "), text),
            ),
            (
                "wrong_type",
                places > f.scale,
                F.concat(
                    F.lit(f"{f.name} "),
                    text,
                    F.lit(" has "),
                    places.cast("string"),
                    F.lit(f" decimal places; the contract allows {f.scale}"),
                ),
            ),
            (
                "wrong_type",
                integer_digits > integer_places,
                F.concat(
                    F.lit(f"{f.name} "),
                    text,
                    F.lit(" has "),
                    integer_digits.cast("string"),
                    F.lit(f" integer digits; the contract allows {integer_places}"),
                ),
            ),
        ]
    elif f.kind == "integer":
        typed = helper(0, "typed", F.when(text.rlike(INTEGER_TEXT), F.expr(f"try_cast(`{f.name}` AS INT)")))
        rules.append(("wrong_type", typed.isNull(), F.concat(F.lit(f"{f.name} is not an integer: "), text)))
    elif f.kind == "timestamp":
        assert f.pattern is not None
        # Within the pattern, Spark's cast reads a value exactly as TIMESTAMP_FORMAT does, several times
        # faster (tests/data/test_ingest_transforms.py compares the two).
        typed = helper(0, "typed", F.when(text.rlike(f.pattern), text.try_cast("timestamp")))
        rules += [
            (
                "wrong_type",
                typed.isNull(),
                F.concat(F.lit(f"{f.name} is not ISO 8601: "), text),
            ),
            (
                "wrong_type",
                text.rlike(r"\.[0-9]{6}0*[1-9][0-9]*(Z|[+-])"),
                F.concat(
                    F.lit(f"{f.name} "),
                    text,
                    F.lit(" has non-zero digits past the microsecond; the lake holds microseconds"),
                ),
            ),
        ]
    else:
        typed = text
    plan.typed = typed
    if f.minimum is not None and f.maximum is not None:
        low = (typed <= f.minimum) if f.min_exclusive else (typed < f.minimum)
        high = (typed >= f.maximum) if f.max_exclusive else (typed > f.maximum)
        rules.append(
            (
                "out_of_range",
                low | high,
                F.concat(F.lit(f"{f.name} "), typed.cast("string"), F.lit(f" outside {f.range_text}")),
            )
        )
    if f.in_arrival_window:
        earliest = arrival - timedelta(days=late_days)
        day = helper(1, "day", F.to_date(typed))
        rules.append(
            (
                "out_of_range",
                (day < F.lit(earliest)) | (day > F.lit(arrival)),
                F.concat(
                    F.lit(f"{f.name.removesuffix('_timestamp')} date "),
                    day.cast("string"),
                    F.lit(f" outside [{earliest}, {arrival}]"),
                ),
            )
        )
    if f.kind == "string":
        if f.max_length is not None:
            rules.append(
                (
                    "invalid_value",
                    present & (F.length(text) > f.max_length),
                    F.concat(
                        F.lit(f"{f.name} "),
                        _shown(F.substring(text, 1, 40)),
                        F.lit(" is "),
                        F.length(text).cast("string"),
                        F.lit(f" characters long; the contract allows {f.max_length}"),
                    ),
                )
            )
        if f.pattern is not None:
            rules.append(
                (
                    "invalid_value",
                    present & ~text.rlike(f.pattern),
                    F.concat(F.lit(f"{f.name} "), _shown(text), F.lit(f" does not match {f.pattern}")),
                )
            )
        if f.allowed is not None:
            rules.append(
                (
                    "invalid_value",
                    present & ~text.isin(*f.allowed),
                    F.concat(F.lit(f"{f.name} not allowed: "), text),
                )
            )
    return plan


def classify_table(raw: DataFrame, contract: TableContract, arrival: date, late_days: int) -> DataFrame:
    """Type the string columns by `contract` and give each row its reason (null for a clean row) and a
    detail: the first rule that applies, reasons in ROW_REASONS order, fields in contract order. The
    columns of `raw` besides the values and the parse error (raw_record, where the line came from) are
    kept.

    The rules are numbered in that order and a row keeps the number of its first failing rule (0: the line
    did not parse); reason and detail are looked up by that number, so each condition is evaluated once per
    row and only the detail of the rule that applies is built.
    """
    plans = {f.name: _field_plan(f, arrival, late_days) for f in contract.fields}
    ordered: list[tuple[str, Column, Column]] = [
        rule for name in ROW_REASONS for plan in plans.values() for rule in plan.rules if rule[0] == name
    ]
    rule = F.when(F.col("parse_error").isNotNull(), F.lit(0))
    for index, (_, condition, _) in enumerate(ordered, start=1):
        rule = rule.when(condition, F.lit(index))
    numbered = raw
    for step in range(len(_FieldPlan().steps)):
        helpers = {k: v for plan in plans.values() for k, v in plan.steps[step].items()}
        numbered = numbered.select("*", *(v.alias(k) for k, v in helpers.items()))
    numbered = numbered.select("*", rule.alias("_rule"))
    number = F.col("_rule")
    reason = F.when(number == F.lit(0), F.col("parse_error"))
    detail = F.when(number == F.lit(0), F.col("parse_detail"))
    for index, (_, _, text) in enumerate(ordered, start=1):
        detail = detail.when(number == F.lit(index), text)
    for name in ROW_REASONS:
        last = max((i for i, r in enumerate(ordered, start=1) if r[0] == name), default=None)
        if last is not None:
            reason = reason.when(number <= F.lit(last), F.lit(name))
    parsed = {*contract.columns, "parse_error", "parse_detail"}
    return numbered.select(
        *(plans[name].typed.alias(name) for name in contract.columns),  # type: ignore[union-attr]
        reason.alias("reason"),
        detail.alias("detail"),
        *(c for c in raw.columns if c not in parsed),
    )


def classify(raw: DataFrame, arrival: date, late_days: int) -> DataFrame:
    """Transactions: typed by TRANSACTIONS_CONTRACT, each row with its reason and detail."""
    return classify_table(raw, TRANSACTIONS_CONTRACT, arrival, late_days)


def pseudonymised(column: str, pseudonyms: Pseudonymiser) -> Column:
    """`column`'s ids replaced by their pseudonyms (core/pseudonym.py) in a pandas UDF: the key rides in the
    pickled function, never as a literal of the plan (explain(), the event log and the UI would show one)."""
    kind = pseudonym.COLUMNS[column]
    return F.pandas_udf(pseudonyms.series_function(kind), StringType())(F.col(column))  # type: ignore[call-overload]


def to_bronze(classified: DataFrame, arrival: date, run_id: str, pseudonyms: Pseudonymiser) -> DataFrame:
    """The rows that passed every row rule, typed, their identifiers pseudonymised: bronze never holds a raw
    customer or merchant id (the quarantine keeps a failing row's raw record, under retention)."""

    def stored(name: str) -> Column:
        return pseudonymised(name, pseudonyms) if name in pseudonym.COLUMNS else F.col(name)

    return classified.where(F.col("reason").isNull()).select(
        *(
            stored(f.name).cast(f.dataType).alias(f.name)
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


def deduplicate(
    bronze: DataFrame,
    run_id: str,
    earlier: DataFrame | None = None,
    keep: Callable[[DataFrame], DataFrame] | None = None,
) -> tuple[DataFrame, DataFrame]:
    """(silver rows, quarantine rows for the removed copies) of one arrival's bronze.

    The first copy by (arrival_date, source_file, line_number) wins. `earlier` holds the
    (transaction_id, arrival_date, source_file, line_number) of the bronze rows of earlier arrivals within
    the lookback: a row of `bronze` whose id is there is a resend, removed with the place of its first copy.
    `keep`, if given, is applied to the ranked rows both results are selected from (to persist them once).
    """
    order = Window.partitionBy("transaction_id").orderBy("source_file", "line_number")
    ranked = bronze.select(
        "*",
        F.row_number().over(order).alias("_copy"),
        F.first(F.concat_ws(":", "source_file", F.col("line_number").cast("string")))
        .over(order)
        .alias("_first"),
    )
    seen_before = F.lit(None).cast(StringType())
    if earlier is not None:
        first_copies = (
            earlier.join(bronze.select("transaction_id").distinct(), "transaction_id", "left_semi")
            .groupBy("transaction_id")
            .agg(F.min(F.struct("arrival_date", "source_file", "line_number")).alias("_earliest"))
        )
        ranked = ranked.join(first_copies, "transaction_id", "left")
        seen_before = F.when(
            F.col("_earliest").isNotNull(),
            F.concat(
                F.lit("transaction_id first seen in arrival "),
                F.col("_earliest.arrival_date").cast("string"),
                F.lit(" "),
                F.col("_earliest.source_file"),
                F.lit(":"),
                F.col("_earliest.line_number").cast("string"),
            ),
        )
    ranked = ranked.withColumn("_seen_before", seen_before)
    if keep is not None:
        ranked = keep(ranked)
    is_copy = (F.col("_copy") > 1) | F.col("_seen_before").isNotNull()
    silver = ranked.where(~is_copy).select(
        *(F.col(f.name) for f in SILVER_TRANSACTIONS.fields if f.name != "event_date"),
        F.to_date("event_timestamp").alias("event_date"),
    )
    business = list(TRANSACTION_COLUMNS)
    duplicates = ranked.where(is_copy).select(
        F.lit("silver").alias("stage"),
        F.lit("duplicate").alias("reason"),
        F.coalesce(
            F.col("_seen_before"), F.concat(F.lit("transaction_id first seen at "), F.col("_first"))
        ).alias("detail"),
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
    (or up to `late_days` before it), by LABELS_CONTRACT. Same reason codes as transactions."""
    return classify_table(raw, LABELS_CONTRACT, arrival, late_days)
