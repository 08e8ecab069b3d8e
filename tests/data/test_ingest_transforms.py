"""The ingestion transforms on tiny inline DataFrames: every line gets exactly one, correct reason."""

from __future__ import annotations

import json
from datetime import date

import pytest

from pipelines.contracts import TRANSACTION_COLUMNS
from pipelines.ingest import transforms

ARRIVAL = date(2026, 1, 10)
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


@pytest.mark.parametrize(
    ("line", "reason", "detail"),
    [
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
    ],
)
def test_each_csv_line_gets_the_right_reason(spark, line, reason, detail):
    (row,) = _classify_csv(spark, [line])
    assert row.reason == reason
    if detail is not None:
        assert row.detail == detail
    assert row.raw_record == line


def test_quoted_commas_count_as_one_token_and_header_order_is_respected(spark):
    header = list(reversed(HEADER))
    quoted = ",".join(f'"{GOOD[c]}"' for c in header)
    (row,) = _classify_csv(spark, [quoted], header=header)
    assert row.reason is None and row.transaction_id == GOOD["transaction_id"] and str(row.amount) == "12.50"


@pytest.mark.parametrize(
    ("record", "reason"),
    [
        (json.dumps({**GOOD, "amount": 12.5}), None),
        (json.dumps({**GOOD, "amount": "twelve"}), "wrong_type"),
        (json.dumps({**GOOD, "merchant_id": None}), "missing_required"),
        (json.dumps({**GOOD, "promo_code": "X"}), "extra_column"),
        (json.dumps({**GOOD})[:40], "malformed"),
        ("[1, 2, 3]", "malformed"),
        ("null", "malformed"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "currency"}), "missing_required"),
    ],
)
def test_each_json_line_gets_the_right_reason(spark, record, reason):
    parsed = transforms.parse_json_lines(_lines(spark, [record]))
    (row,) = transforms.classify(parsed, ARRIVAL, late_days=1).collect()
    assert row.reason == reason


def test_bronze_and_quarantine_partition_the_input(spark):
    lines = [_csv(), _csv(amount="x"), _csv(transaction_id="tx00000000000000ff"), "garbage"]
    classified = transforms.classify(transforms.parse_csv_lines(_lines(spark, lines), HEADER), ARRIVAL, 1)
    bronze = transforms.to_bronze(classified, ARRIVAL, "run-1").collect()
    quarantine = transforms.to_quarantine(classified, ARRIVAL, "run-1").collect()
    assert len(bronze) + len(quarantine) == len(lines)
    assert {r.line_number for r in bronze} == {2, 4}
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
    silver, duplicates = transforms.deduplicate(transforms.to_bronze(classified, ARRIVAL, "r"), "r")
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
