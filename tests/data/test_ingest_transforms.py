"""The ingestion transforms on tiny inline DataFrames: every line gets exactly one, correct reason."""

from __future__ import annotations

import functools
import itertools
import json
import random
from datetime import date

import pytest
from pyspark.sql import functions as F

from core.pseudonym import Pseudonymiser
from pipelines.contracts import LABEL_COLUMNS, TRANSACTION_COLUMNS, TRANSACTIONS_CONTRACT
from pipelines.ingest import transforms

ARRIVAL = date(2026, 1, 10)
PSEUDONYMS = Pseudonymiser(b"a test key of 32 bytes, not used")
HEADER = list(TRANSACTION_COLUMNS)
GOOD = {
    "transaction_id": "tx0123456789abcdef",
    "customer_id": "c0000001",
    "merchant_id": "m000002",
    "amount": "12.50",
    "currency": "EUR",
    "country": "DE",
    "channel": "pos",
    "merchant_category": "grocery",
    "event_timestamp": "2026-01-10T08:00:00.123Z",
}


def _csv(**changes) -> str:
    row = {**GOOD, **changes}
    return ",".join(row[c] for c in HEADER)


def _lines(spark, values):
    return spark.createDataFrame(
        [(v, "transactions-00000.csv", i + 2) for i, v in enumerate(values)],
        "value string, source_file string, line_number long",
    )


def _classify_csv(spark, values, header=HEADER):
    parsed = transforms.parse_csv_lines(_lines(spark, values), header)
    return transforms.classify(parsed, ARRIVAL, late_days=1).orderBy("line_number").collect()


CSV_REASONS = [
    (_csv(), None, None),
    (_csv(event_timestamp="2026-01-09T23:59:59Z"), None, None),  # late by a day: allowed
    (_csv(amount="0.01"), None, None),
    (",".join(GOOD[c] for c in HEADER[:5]), "malformed", None),  # too few tokens
    ('"' + _csv(), "malformed", None),  # unbalanced quote
    ("", "malformed", None),
    ("\x1b~~garbled~~", "malformed", None),
    (_csv() + ",EXTRA", "extra_column", None),
    (_csv(customer_id=""), "missing_required", "customer_id is null or blank"),
    (_csv(event_timestamp=""), "missing_required", "event_timestamp is null or blank"),
    (_csv(amount="   "), "missing_required", "amount is null or blank"),
    (_csv(amount="twelve"), "wrong_type", "amount is not a decimal number: twelve"),
    (
        _csv(event_timestamp="31/13/2026 25:61"),
        "wrong_type",
        "event_timestamp is not ISO 8601: 31/13/2026 25:61",
    ),
    (_csv(amount="-3.00"), "out_of_range", "amount -3.00 outside (0, 50000]"),
    (_csv(amount="0"), "out_of_range", "amount 0.00 outside (0, 50000]"),
    (_csv(amount="50000.01"), "out_of_range", "amount 50000.01 outside (0, 50000]"),
    (
        _csv(event_timestamp="2027-01-10T08:00:00Z"),
        "out_of_range",
        "event date 2027-01-10 outside [2026-01-09, 2026-01-10]",
    ),
    (
        _csv(event_timestamp="2026-01-08T08:00:00Z"),
        "out_of_range",
        "event date 2026-01-08 outside [2026-01-09, 2026-01-10]",
    ),
    (_csv(currency="XXX"), "invalid_value", "currency not allowed: XXX"),
    (_csv(channel="telepathy"), "invalid_value", "channel not allowed: telepathy"),
    (_csv(country=""), None, None),  # country is optional
]


@pytest.mark.parametrize(("line", "reason", "detail"), CSV_REASONS)
def test_each_csv_line_gets_the_right_reason(verdict, line, reason, detail):
    row = verdict("csv", line)
    assert row.reason == reason
    if detail is not None:
        assert row.detail == detail
    assert row.raw_record == line


def test_quoted_commas_count_as_one_token_and_header_order_is_respected(spark):
    header = list(reversed(HEADER))
    quoted = ",".join(f'"{GOOD[c]}"' for c in header)
    (row,) = _classify_csv(spark, [quoted], header=header)
    assert row.reason is None and row.transaction_id == GOOD["transaction_id"] and str(row.amount) == "12.50"


JSON_REASONS = [
    (json.dumps({**GOOD, "amount": 12.5}), None),
    (json.dumps({**GOOD, "amount": "twelve"}), "wrong_type"),
    (json.dumps({**GOOD, "merchant_id": None}), "missing_required"),
    (json.dumps({**GOOD, "promo_code": "X"}), "extra_column"),
    (json.dumps({**GOOD})[:40], "malformed"),
    ("[1, 2, 3]", "malformed"),
    ("null", "malformed"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "currency"}), "missing_required"),
]


@pytest.mark.parametrize(("record", "reason"), JSON_REASONS)
def test_each_json_line_gets_the_right_reason(verdict, record, reason):
    assert verdict("json", record).reason == reason


def test_bronze_and_quarantine_partition_the_input(spark):
    lines = [_csv(), _csv(amount="x"), _csv(transaction_id="tx00000000000000ff"), "garbage"]
    classified = transforms.classify(transforms.parse_csv_lines(_lines(spark, lines), HEADER), ARRIVAL, 1)
    bronze = transforms.to_bronze(classified, ARRIVAL, "run-1", PSEUDONYMS).collect()
    quarantine = transforms.to_quarantine(classified, ARRIVAL, "run-1").collect()
    assert len(bronze) + len(quarantine) == len(lines)
    assert {r.line_number for r in bronze} == {2, 4}
    # bronze holds the ids' pseudonyms; the quarantine keeps the failing rows' raw records
    assert {(r.customer_id, r.merchant_id) for r in bronze} == {
        (PSEUDONYMS.customer(GOOD["customer_id"]), PSEUDONYMS.merchant(GOOD["merchant_id"]))
    }
    assert sorted((r.line_number, r.reason) for r in quarantine) == [(3, "wrong_type"), (5, "malformed")]
    assert all(r.stage == "bronze" and r.run_id == "run-1" and r.arrival_date == ARRIVAL for r in quarantine)


def test_deduplicate_keeps_the_first_copy_by_file_and_line(spark):
    lines = [_csv(), _csv(amount="99.00"), _csv(transaction_id="tx00000000000000aa")]
    rows = [
        (v, f, n)
        for v, f, n in [
            (lines[0], "transactions-00001.csv", 7),
            (lines[1], "transactions-00000.csv", 9),
            (lines[2], "transactions-00000.csv", 2),
        ]
    ]
    df = spark.createDataFrame(rows, "value string, source_file string, line_number long")
    classified = transforms.classify(transforms.parse_csv_lines(df, HEADER), ARRIVAL, 1)
    silver, duplicates = transforms.deduplicate(
        transforms.to_bronze(classified, ARRIVAL, "r", PSEUDONYMS), "r"
    )
    kept = {r.transaction_id: r for r in silver.collect()}
    assert len(kept) == 2
    assert str(kept[GOOD["transaction_id"]].amount) == "99.00"  # transactions-00000.csv:9 comes first
    (dropped,) = duplicates.collect()
    assert (dropped.source_file, dropped.line_number, dropped.reason) == (
        "transactions-00001.csv",
        7,
        "duplicate",
    )
    assert dropped.detail == "transaction_id first seen at transactions-00000.csv:9"
    assert json.loads(dropped.raw_record)["amount"] == 12.5
    assert kept[GOOD["transaction_id"]].event_date == ARRIVAL


# --- Hand-written values of every class the contract meets: each is typed exactly or quarantined with a
# reason whose detail names the column and the value as sent; none is trimmed, rounded or dropped.
TYPED = [
    ("amount", "1e3", "1000.00"),
    ("amount", "+3", "3.00"),
    ("amount", "10.000", "10.00"),  # trailing zeros past the scale: the value is held exactly
    ("amount", "0012.5", "12.50"),
    ("amount", "49999.99", "49999.99"),
    ("amount", "5e4", "50000.00"),  # the maximum is inclusive
    ("event_timestamp", "2026-01-10T13:30:00+05:30", "2026-01-10 08:00:00"),
    ("event_timestamp", "2026-01-10T01:00:00+05:30", "2026-01-09 19:30:00"),  # the UTC date decides
    ("event_timestamp", "2026-01-10T08:00:00.123456Z", "2026-01-10 08:00:00.123456"),
    ("event_timestamp", "2026-01-10T08:00:00.123456000-02:00", "2026-01-10 10:00:00.123456"),
    ("event_timestamp", "2026-01-10T08:00:00.5Z", "2026-01-10 08:00:00.500000"),
]
QUARANTINED = [
    ("amount", "10.005", "wrong_type", "amount 10.005 has 3 decimal places; the contract allows 2"),
    ("amount", "1.0005e1", "wrong_type", "amount 1.0005e1 has 3 decimal places; the contract allows 2"),
    ("amount", "1e-30", "wrong_type", "amount 1e-30 has 30 decimal places; the contract allows 2"),
    (
        "amount",
        "12345678901",
        "wrong_type",
        "amount 12345678901 has 11 integer digits; the contract allows 10",
    ),
    ("amount", '"1,000.00"', "wrong_type", "amount is not a decimal number: 1,000.00"),
    ("amount", " 12.5", "wrong_type", "amount is not a decimal number:  12.5"),
    ("amount", "12.5 ", "wrong_type", "amount is not a decimal number: 12.5 "),
    ("amount", ".5", "wrong_type", "amount is not a decimal number: .5"),
    ("amount", "0x10", "wrong_type", "amount is not a decimal number: 0x10"),
    ("amount", "-0", "out_of_range", "amount 0.00 outside (0, 50000]"),
    ("amount", "5.00001e4", "out_of_range", "amount 50000.10 outside (0, 50000]"),
    ("transaction_id", "tx12", "invalid_value", 'transaction_id "tx12" does not match ^tx[0-9a-f]{16}\\z'),
    ("transaction_id", "TX0123456789ABCDEF", "invalid_value", 'transaction_id "TX0123456789ABCDEF" does not'),
    ("transaction_id", "tx0123456789abcdef ", "invalid_value", 'transaction_id "tx0123456789abcdef " is 19'),
    (
        "transaction_id",
        "tx0123456789abcd\u0435f",
        "invalid_value",
        'transaction_id "tx0123456789abcd\u0435f"',
    ),
    ("customer_id", "c1", "invalid_value", 'customer_id "c1" does not match ^c[0-9]{7}\\z'),
    ("customer_id", "c\uff10000001", "invalid_value", "customer_id"),  # a full-width digit
    (
        "merchant_id",
        "m00000\x07",
        "invalid_value",
        'merchant_id "m00000\\u0007" does not match ^m[0-9]{6}\\z',
    ),
    ("currency", "EUR ", "invalid_value", "currency not allowed: EUR "),
    ("currency", "eur", "invalid_value", "currency not allowed: eur"),
    ("channel", "pos\t", "invalid_value", "channel not allowed: pos\t"),
    (
        "event_timestamp",
        "2026-01-10 08:00:00Z",
        "wrong_type",
        "event_timestamp is not ISO 8601: 2026-01-10 08:00:00Z",
    ),
    (
        "event_timestamp",
        "2026-01-10T08:00:00",
        "wrong_type",
        "event_timestamp is not ISO 8601: 2026-01-10T08:00:00",
    ),
    ("event_timestamp", "2026-01-10T08:00:00+0530", "wrong_type", "event_timestamp is not ISO 8601: "),
    ("event_timestamp", "2026-02-30T08:00:00Z", "wrong_type", "event_timestamp is not ISO 8601: "),
    (
        "event_timestamp",
        "2026-01-10T08:00:00.1234567Z",
        "wrong_type",
        "event_timestamp 2026-01-10T08:00:00.1234567Z has non-zero digits past the microsecond",
    ),
    (
        "event_timestamp",
        "2026-01-10T08:00:00.123456789+05:30",
        "wrong_type",
        "event_timestamp 2026-01-10T08:00:00.123456789+05:30 has non-zero digits past the microsecond",
    ),
]


@pytest.mark.parametrize(("column", "value", "expected"), TYPED)
def test_a_value_the_contract_holds_is_typed_exactly(verdict, column, value, expected):
    row = verdict("csv", _csv(**{column: value}))
    assert (row.reason, row.detail) == (None, None)
    assert str(row[column]) == expected


@pytest.mark.parametrize(("column", "value", "reason", "detail"), QUARANTINED)
def test_a_value_the_contract_cannot_hold_is_quarantined_naming_column_and_value(
    verdict, column, value, reason, detail
):
    line = _csv(**{column: value})
    row = verdict("csv", line)
    assert row.reason == reason, row.detail
    if reason is not None:
        assert row.detail.startswith(detail) and column in row.detail
    assert row.raw_record == line


ESCAPED_QUOTES = _csv(merchant_category='"grocery, ""fresh"""')


def test_a_quoted_field_with_escaped_quotes_and_commas_is_one_value_and_is_judged_as_sent(verdict):
    row = verdict("csv", ESCAPED_QUOTES)
    assert row.reason == "invalid_value"
    assert row.detail == 'merchant_category not allowed: grocery, "fresh"'


def _json_with_amount(amount: str) -> str:
    return json.dumps({k: v for k, v in GOOD.items() if k != "amount"})[:-1] + f', "amount": {amount}}}'


JSON_NUMBERS = [
    ("10.000000000000000001", "wrong_type", None),  # through a double it would read 10.0
    ("1e3", None, "1000.00"),
    ("12.50", None, "12.50"),
    ('"12.505"', "wrong_type", None),
    ("10.005", "wrong_type", None),
    # Java's `$` also matches before a final line break, and Spark's cast trims it: never cleaned.
    ('"12.5\\n"', "wrong_type", None),
    ('"12.5\\r\\n"', "wrong_type", None),
]


@pytest.mark.parametrize(("amount", "reason", "typed"), JSON_NUMBERS)
def test_a_json_number_is_judged_by_the_text_it_was_sent_as(verdict, amount, reason, typed):
    row = verdict("json", _json_with_amount(amount))
    assert row.reason == reason, row.detail
    # A quarantined amount is not typed at all (null), never typed approximately.
    assert (None if row.amount is None else str(row.amount)) == typed


def test_a_byte_order_mark_opening_a_json_lines_file_is_not_data(spark):
    first = "\ufeff" + json.dumps(GOOD)
    lines = spark.createDataFrame(
        [(first, "transactions-00000.jsonl", 1)], "value string, source_file string, line_number long"
    )
    (row,) = transforms.classify(transforms.parse_json_lines(lines), ARRIVAL, 1).collect()
    assert row.reason is None and row.transaction_id == GOOD["transaction_id"] and row.raw_record == first


LABEL_REASONS = [
    ("tx0123456789abcdef,1,2026-01-10T08:00:00Z", None, None),
    ("tx0123456789abcdef,1,2026-01-10 08:00:00Z", "wrong_type", "label_timestamp is not ISO 8601: "),
    ("tx0123456789abcdef,1.0,2026-01-10T08:00:00Z", "wrong_type", "is_fraud is not an integer: 1.0"),
    ("tx0123456789abcdef,2,2026-01-10T08:00:00Z", "out_of_range", "is_fraud 2 outside [0, 1]"),
    ("tx12,1,2026-01-10T08:00:00Z", "invalid_value", 'transaction_id "tx12" does not match'),
]


@pytest.mark.parametrize(("line", "reason", "detail"), LABEL_REASONS)
def test_labels_follow_their_contract(verdict, line, reason, detail):
    row = verdict("labels_csv", line)
    assert row.reason == reason, row.detail
    if detail:
        assert row.detail.startswith(detail)


def test_a_resend_in_a_later_arrival_is_a_duplicate_naming_the_first_copy(spark):
    later = date(2026, 1, 11)
    today = transforms.parse_csv_lines(
        _lines(spark, [_csv(), _csv(transaction_id="tx00000000000000aa")]), HEADER
    )
    bronze = transforms.to_bronze(transforms.classify(today, later, 1), later, "r", PSEUDONYMS)
    earlier = spark.createDataFrame(
        [
            (GOOD["transaction_id"], ARRIVAL, "transactions-00003.csv", 17),
            (GOOD["transaction_id"], ARRIVAL, "transactions-00001.csv", 40),
        ],
        "transaction_id string, arrival_date date, source_file string, line_number long",
    )
    silver, duplicates = transforms.deduplicate(bronze, "r", earlier)
    assert [r.transaction_id for r in silver.collect()] == ["tx00000000000000aa"]
    (copy,) = duplicates.collect()
    assert (copy.line_number, copy.arrival_date) == (2, later)
    assert copy.detail == "transaction_id first seen in arrival 2026-01-10 transactions-00001.csv:40"


CSV_DETAILS = [
    ("", "malformed", "empty line"),
    (_csv(merchant_category='"groc'), "malformed", "unbalanced quotes: 1 quote characters"),
    (",".join(GOOD[c] for c in HEADER[:5]), "malformed", "5 fields; the header has 9"),
    (_csv() + ",EXTRA", "extra_column", "10 fields; the header has 9"),
]


@pytest.mark.parametrize(("line", "reason", "detail"), CSV_DETAILS)
def test_a_csv_line_that_does_not_parse_has_a_detail_saying_why(verdict, line, reason, detail):
    row = verdict("csv", line)
    assert row.reason == reason
    assert row.detail is not None and row.detail.startswith(detail), row.detail


JSON_DETAILS = [
    # from_json keeps both copies of a key, and a lookup would silently take one of them
    (json.dumps(GOOD)[:-1] + ', "amount": "99.00"}', "malformed", "key(s) sent more than once: amount"),
    (json.dumps(GOOD)[:-1] + ', "amount": +5}', "malformed", "not a JSON object"),
    (json.dumps({**GOOD, "promo_code": "X"}), "extra_column", "key(s) outside the contract: promo_code"),
]


@pytest.mark.parametrize(("record", "reason", "detail"), JSON_DETAILS)
def test_a_json_line_that_does_not_parse_has_a_detail_saying_why(verdict, record, reason, detail):
    row = verdict("json", record)
    assert row.reason == reason
    assert row.detail is not None and row.detail.startswith(detail), row.detail


def _label_json(is_fraud: str) -> str:
    return (
        f'{{"transaction_id": "tx0123456789abcdef", "is_fraud": {is_fraud}, '
        '"label_timestamp": "2026-01-10T08:00:00Z"}'
    )


LABEL_BREAKS = ['"1\\n"', '"0\\r\\n"']


@pytest.mark.parametrize("is_fraud", LABEL_BREAKS)
def test_a_label_value_with_a_trailing_line_break_is_quarantined_not_trimmed(verdict, is_fraud):
    row = verdict("labels_json", _label_json(is_fraud))
    assert (row.reason, row.is_fraud) == ("wrong_type", None), row.detail


# --- Where ingestion reads values its own faster way, the library's own call on the same values is the
# reference (ARCHITECTURE.md: contract tests for the project's own version of a library path).
def _timestamps() -> list[str]:
    """Instants in the contract's shape, valid and not: impossible dates and times, leap days, fractions of
    every length, offsets in and out of range."""
    parts = [
        ["0001", "1970", "2000", "2024", "2026", "2100", "9999"],
        ["00", "01", "02", "12", "13"],
        ["00", "01", "28", "29", "30", "31", "32"],
        ["00", "23", "24"],
        ["00", "59", "60"],
        ["00", "59", "60"],
        ["", ".5", ".123", ".123456", ".1234567", ".123456000", ".999999999"],
        ["Z", "+00:00", "-00:00", "+05:30", "+14:00", "+18:00", "+18:01", "-19:00", "+05:60"],
    ]
    values = [f"{y}-{mo}-{d}T{h}:{mi}:{s}{f}{z}" for y, mo, d, h, mi, s, f, z in itertools.product(*parts)]
    return values[::7]  # a spread of every combination, small enough to run in seconds


def test_a_timestamp_is_read_exactly_as_the_contract_format_reads_it(spark):
    values = _timestamps()
    rows = transforms.classify(
        transforms.parse_csv_lines(_lines(spark, [_csv(event_timestamp=v) for v in values]), HEADER),
        ARRIVAL,
        late_days=1,
    )
    text = F.get(F.split("raw_record", ","), HEADER.index("event_timestamp"))
    reference = F.when(
        text.rlike(TRANSACTIONS_CONTRACT.field("event_timestamp").pattern or ""),
        F.try_to_timestamp(text, F.lit(transforms.TIMESTAMP_FORMAT)),
    )
    compared = rows.select("event_timestamp", reference.alias("reference"))
    assert compared.where("event_timestamp is not null").count() > 100
    differing = compared.where(~F.col("event_timestamp").eqNullSafe(F.col("reference"))).limit(5).collect()
    assert differing == []


def test_an_unquoted_line_is_split_into_the_fields_sparks_csv_parser_reads(spark):
    """Lines without a quote are split on commas; Spark's CSV parser (which reads the quoted ones) must give
    the same fields: empty ones null, spaces, control characters and marks kept as sent."""
    alphabet = [*"aZ0 \t\x00#\\';\x07\x0b", "\u0435", "\ufeff", "\x85"]
    draw = random.Random(7)
    values = [
        ",".join(
            "".join(draw.choice(alphabet) for _ in range(draw.choice([0, 0, 1, 2, 5])))
            for _ in range(draw.choice([8, 9, 9, 10]))
        )
        for _ in range(3000)
    ] + ["", ",,,,,,,,", "#" + _csv(), "\\," + _csv()]
    parsed = transforms.parse_csv_lines(_lines(spark, values), HEADER)
    ddl = ", ".join(f"`{c}` STRING" for c in HEADER)
    library = F.from_csv("raw_record", ddl, {"mode": "PERMISSIVE", "escape": '"'})
    same = [F.col(c).eqNullSafe(library[c]) for c in HEADER]
    differing = parsed.where(~functools.reduce(lambda a, b: a & b, same)).select("raw_record").limit(5)
    assert differing.collect() == []


# --- Every input the tests above judge on its own is classified in one Spark job per kind, on first use:
# a job per line cost most of this module's time. Classification is row by row (no window, no join), so a
# line's verdict does not depend on the lines beside it; the test below holds the batches to that.
def _parse_labels_csv(lines):
    return transforms.parse_csv_lines(lines, list(LABEL_COLUMNS), LABEL_COLUMNS)


KINDS = {  # kind -> (parse, classify)
    "csv": (lambda lines: transforms.parse_csv_lines(lines, HEADER), transforms.classify),
    "json": (transforms.parse_json_lines, transforms.classify),
    "labels_csv": (_parse_labels_csv, transforms.classify_labels),
    "labels_json": (
        lambda lines: transforms.parse_json_lines(lines, LABEL_COLUMNS),
        transforms.classify_labels,
    ),
}
BATCHES = {
    "csv": [
        *(line for line, _, _ in CSV_REASONS),
        *(_csv(**{column: value}) for column, value, _ in TYPED),
        *(_csv(**{column: value}) for column, value, _, _ in QUARANTINED),
        ESCAPED_QUOTES,
        *(line for line, _, _ in CSV_DETAILS),
    ],
    "json": [
        *(record for record, _ in JSON_REASONS),
        *(_json_with_amount(amount) for amount, _, _ in JSON_NUMBERS),
        *(record for record, _, _ in JSON_DETAILS),
    ],
    "labels_csv": [line for line, _, _ in LABEL_REASONS],
    # and a valid label, so that the batch holds more than one verdict
    "labels_json": [*(_label_json(is_fraud) for is_fraud in LABEL_BREAKS), _label_json("1")],
}


def _judge(spark, kind: str, inputs: list[str]) -> dict[str, object]:
    """Each distinct input's classified row, by input (line numbers from 2 in the order given)."""
    distinct = list(dict.fromkeys(inputs))
    parse, classify = KINDS[kind]
    rows = classify(parse(_lines(spark, distinct)), ARRIVAL, 1).collect()
    assert sorted(row.line_number for row in rows) == list(range(2, len(distinct) + 2))
    return {distinct[row.line_number - 2]: row for row in rows}


@pytest.fixture(scope="module")
def verdict(spark):
    """verdict(kind, input): the row `input` is classified to, from its kind's batch (BATCHES)."""
    judged: dict[str, dict[str, object]] = {}

    def lookup(kind: str, value: str):
        if kind not in judged:
            judged[kind] = _judge(spark, kind, BATCHES[kind])
        assert value in judged[kind], f"{value!r} is not in BATCHES[{kind!r}]"
        return judged[kind][value]

    return lookup


@pytest.mark.parametrize("kind", sorted(BATCHES))
def test_a_line_judged_in_a_batch_gets_the_verdict_it_gets_alone(spark, verdict, kind):
    # The batch's first input of each of (up to) three verdicts, judged alone, against its row in the batch.
    by_reason: dict[object, str] = {}
    for value in BATCHES[kind]:
        by_reason.setdefault(verdict(kind, value).reason, value)
    assert len(by_reason) >= 2, by_reason
    for value in list(by_reason.values())[:3]:
        alone = _judge(spark, kind, [value])[value].asDict()
        batched = verdict(kind, value).asDict()
        assert {**alone, "line_number": None} == {**batched, "line_number": None}, value


def test_the_pseudonym_key_is_in_no_query_plan(spark):
    """The key rides in the pickled UDF, never as a literal: explain(), the event log and the UI show
    plans."""
    classified = transforms.classify(transforms.parse_csv_lines(_lines(spark, [_csv()]), HEADER), ARRIVAL, 1)
    bronze = transforms.to_bronze(classified, ARRIVAL, "r", PSEUDONYMS)
    plans = bronze._jdf.queryExecution().toString()
    assert "pseudonymise_customer" in plans  # the plan was read
    for shown in (PSEUDONYMS.key.hex(), PSEUDONYMS.key.decode(), PSEUDONYMS.key.hex().upper()):
        assert shown not in plans


def test_the_split_counts_are_one_spark_job_and_number_every_line(spark, tmp_path):
    """read_splits is one aggregation over the persisted, classified lines: with adaptive execution it was
    three jobs (the cache's materialization, the shuffle stage, the result), a cost paid by every ingestion
    of every date (docs/benchmarks.md, "Spark jobs per step"). The counts must number each file's lines
    from 1, whatever split a line was read in."""
    from pyspark import StorageLevel

    from pipelines.ingest.landing import LandingFile, number_lines, read_lines, read_splits

    files = []
    for name, n in (("a.csv", 5), ("b.csv", 3)):
        path = tmp_path / name
        path.write_text("".join(f"{name}-{i}\n" for i in range(1, n + 1)))
        files.append(LandingFile(path=path, fmt="csv"))
    stored = read_lines(spark, files).persist(StorageLevel.DISK_ONLY)
    try:
        spark.sparkContext.setJobGroup("split-counts", "read_splits")
        try:
            splits, _ = read_splits(stored)
        finally:
            spark.sparkContext.setJobGroup("other", "")
        assert len(spark.sparkContext.statusTracker().getJobIdsForGroup("split-counts")) == 1
        numbered = number_lines(stored, splits).collect()
    finally:
        stored.unpersist()
    assert sorted((s.source_file, s.lines) for s in splits) == [("a.csv", 5), ("b.csv", 3)]
    assert {(r.source_file, r.line_number, r.value) for r in numbered} == {
        (name, i, f"{name}-{i}") for name, n in (("a.csv", 5), ("b.csv", 3)) for i in range(1, n + 1)
    }
