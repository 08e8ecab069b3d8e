from __future__ import annotations

import json

import pytest

from pipelines.contracts import REQUIRED_TRANSACTION_COLUMNS, TRANSACTION_COLUMNS
from pipelines.synthetic.faults import VARIANTS, FaultKind, FaultSpecError, corrupt, parse_faults

RECORD = {
    "transaction_id": "tx0123456789abcdef",
    "customer_id": "c0000001",
    "merchant_id": "m000002",
    "amount": 12.5,
    "currency": "EUR",
    "country": "DE",
    "channel": "pos",
    "merchant_category": "grocery",
    "event_timestamp": "2026-01-01T10:00:00.000Z",
}
COLUMNS = list(TRANSACTION_COLUMNS)


def test_parse_faults_reads_every_kind():
    spec = ",".join(f"{k.value}=0.01" for k in FaultKind)
    assert parse_faults(spec) == {k: 0.01 for k in FaultKind}
    assert parse_faults(None) == {}
    assert parse_faults(" malformed = 0.5 ") == {FaultKind.MALFORMED: 0.5}


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("typo=0.1", "unknown fault kind 'typo'; known kinds: malformed"),
        ("malformed", "has no rate"),
        ("malformed=abc", "rate 'abc' is not a number"),
        ("nulls=1.5", "outside \\[0, 1\\]"),
        ("nulls=-0.1", "outside \\[0, 1\\]"),
        ("nulls=0.1,nulls=0.2", "given twice"),
        ("malformed=0.6,duplicates=0.6", "add up to 1.200"),
    ],
)
def test_parse_faults_rejects_bad_specs_with_a_message_naming_the_problem(spec, message):
    with pytest.raises(FaultSpecError, match=message):
        parse_faults(spec)


def _csv_tokens(line: str) -> list[str]:
    import csv

    return next(csv.reader([line]))


@pytest.mark.parametrize("variant", range(VARIANTS[FaultKind.MALFORMED]))
def test_malformed_csv_rows_do_not_have_the_header_column_count(variant):
    line = corrupt(FaultKind.MALFORMED, variant, RECORD, "csv", COLUMNS)
    assert len(_csv_tokens(line)) != len(COLUMNS)


@pytest.mark.parametrize("variant", range(VARIANTS[FaultKind.MALFORMED]))
def test_malformed_json_rows_do_not_parse(variant):
    with pytest.raises(json.JSONDecodeError):
        json.loads(corrupt(FaultKind.MALFORMED, variant, RECORD, "json", COLUMNS))


def test_extra_column_adds_exactly_one_token_or_key():
    assert len(_csv_tokens(corrupt(FaultKind.EXTRA_COLUMN, 0, RECORD, "csv", COLUMNS))) == len(COLUMNS) + 1
    assert set(json.loads(corrupt(FaultKind.EXTRA_COLUMN, 0, RECORD, "json", COLUMNS))) - set(COLUMNS) == {
        "promo_code"
    }


@pytest.mark.parametrize("variant", range(VARIANTS[FaultKind.NULLS]))
def test_nulls_empty_exactly_one_required_field(variant):
    row = json.loads(corrupt(FaultKind.NULLS, variant, RECORD, "json", COLUMNS))
    assert [c for c in COLUMNS if row[c] is None] == [REQUIRED_TRANSACTION_COLUMNS[variant]]
    tokens = _csv_tokens(corrupt(FaultKind.NULLS, variant, RECORD, "csv", COLUMNS))
    assert [c for c, t in zip(COLUMNS, tokens, strict=True) if t == ""] == [
        REQUIRED_TRANSACTION_COLUMNS[variant]
    ]


def test_out_of_range_and_wrong_type_change_only_their_field():
    negative = json.loads(corrupt(FaultKind.OUT_OF_RANGE, 0, RECORD, "json", COLUMNS))
    assert negative["amount"] == -12.5 and negative["transaction_id"] == RECORD["transaction_id"]
    next_year = json.loads(corrupt(FaultKind.OUT_OF_RANGE, 2, RECORD, "json", COLUMNS))
    assert next_year["event_timestamp"] == "2027-01-01T10:00:00.000Z"
    wrong = json.loads(corrupt(FaultKind.WRONG_TYPE, 0, RECORD, "json", COLUMNS))
    with pytest.raises(ValueError):
        float(wrong["amount"])


def test_a_row_fault_respects_a_file_that_lacks_a_column():
    columns = [c for c in COLUMNS if c != "amount"]
    line = corrupt(FaultKind.OUT_OF_RANGE, 0, RECORD, "csv", columns)
    assert len(_csv_tokens(line)) == len(columns)
