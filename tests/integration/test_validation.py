"""GX validation on the real engines: how many Spark jobs a suite costs, and what a failure says."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from core.errors import DataValidationError
from core.pseudonym import Pseudonymiser
from pipelines.ingest.schemas import BRONZE_TRANSACTIONS
from pipelines.validation import validate

DAY = date(2026, 1, 5)
ROW_BOUNDS = {"min_rows": 1, "max_rows": 100}
PSEUDONYMS = Pseudonymiser(b"the validation tests' own key 32")


def _bronze(spark, **changes):
    rows = []
    for n in range(3):
        row = {
            "transaction_id": f"tx0123456789abc00{n}",
            "customer_id": PSEUDONYMS.customer("c0000001"),  # bronze holds pseudonyms, never raw ids
            "merchant_id": PSEUDONYMS.merchant("m000002"),
            "amount": Decimal("12.50"),
            "currency": "EUR",
            "country": "DE",
            "channel": "pos",
            "merchant_category": "grocery",
            "event_timestamp": datetime(2026, 1, 5, 8, tzinfo=UTC),
            "source_file": "transactions-00000.csv",
            "line_number": n + 2,
            "run_id": "run",
            "arrival_date": DAY,
        }
        rows.append({**row, **(changes if n == 1 else {})})
    return spark.createDataFrame(rows, BRONZE_TRANSACTIONS)


def _jobs(spark, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def test_a_passing_suite_costs_one_spark_job_per_column_it_checks_at_most(spark, tmp_path):
    """GX bundles a suite's counts into one aggregation per column (and one for the table); the examples of
    unexpected values its default result format also fetches would cost one or two jobs per expectation."""
    df = _bronze(spark)
    spark.sparkContext.setJobGroup("bronze-suite", "validate")
    try:
        summary = validate(df, "bronze_transactions", tmp_path, ROW_BOUNDS)
    finally:
        spark.sparkContext.setJobGroup("other", "")
    assert summary["success"] and summary["evaluated"] > 20
    checked = {"transaction_id", "customer_id", "merchant_id", "amount", "currency", "country", "channel"}
    checked |= {"merchant_category", "event_timestamp", "source_file", "line_number", "arrival_date"}
    assert _jobs(spark, "bronze-suite") <= len(checked) + 1
    assert summary["data_docs"].endswith("index.html")


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"currency": "XXX"},
            "expect_column_values_to_be_in_set on column 'currency': 1 unexpected value(s), e.g. ['XXX']",
        ),
        ({"amount": Decimal("0.00")}, "expect_column_values_to_be_between on column 'amount': 1 unexpected"),
        ({"customer_id": "c1"}, "expect_column_values_to_match_regex on column 'customer_id': 1 unexpected"),
        # a raw id past landing is a defect of the pipeline, and the gate says so
        (
            {"merchant_id": "m000002"},
            "expect_column_values_to_match_regex on column 'merchant_id': 1 unexpected",
        ),
    ],
)
def test_a_failing_expectation_names_itself_its_column_and_the_values_at_fault(
    spark, tmp_path, change, expected
):
    with pytest.raises(DataValidationError) as error:
        validate(_bronze(spark, **change), "bronze_transactions", tmp_path, ROW_BOUNDS)
    message = str(error.value)
    assert expected in message, message
    assert str(next(iter(change.values()))) in message.split(expected[:30], 1)[1].split("\n", 1)[0]
    docs = message.rsplit("Data docs: file://", 1)[1].strip()
    assert docs.endswith("index.html") and (tmp_path / "gx").is_dir()
