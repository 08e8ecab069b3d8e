"""The GX suites of the landing tables, generated from their data contracts (pipelines/contracts.py).

The suite files in great_expectations/ stay files (reviewed like code, dependencies of the DVC stages, shown
in data docs) but are written by this module, never by hand: `python -m pipelines.suites` rewrites them, and
tests/unit/test_contract_suites.py fails when a file and the contract disagree.

A suite has two parts. The row-level expectations mirror the row rules of ingestion, so they are a
cross-check that must pass (every row that fails one was quarantined before the table was written). The
batch expectations are the gate: row-count bounds against the previous arrival date (GX parameters
`min_rows`/`max_rows`, set by the pipeline) and uniqueness of the key in silver.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pipelines.contracts import LABELS_CONTRACT, TRANSACTIONS_CONTRACT, TableContract

# Columns ingestion adds to each layer, after the contract's own.
LAYER_COLUMNS: dict[str, tuple[str, ...]] = {
    "bronze": ("source_file", "line_number", "run_id", "arrival_date"),
    "silver": ("source_file", "line_number", "arrival_date"),
}
# Suite name -> (contract, layer) of every generated suite.
GENERATED_SUITES: dict[str, tuple[TableContract, str]] = {
    "bronze_transactions": (TRANSACTIONS_CONTRACT, "bronze"),
    "silver_transactions": (TRANSACTIONS_CONTRACT, "silver"),
    "silver_labels": (LABELS_CONTRACT, "silver"),
}
_SPARK_TYPES = {"decimal": "DecimalType", "timestamp": "TimestampType", "integer": "IntegerType"}
_NOTES = {
    "bronze_transactions": "Typed rows of one arrival date; rows that fail a row rule are in quarantine, not "
    "here. Row count is bounded relative to the previous arrival date ($PARAMETER min_rows/max_rows, set by "
    "the pipeline).",
    "silver_transactions": "Cleaned transactions of one arrival date, deduplicated against themselves and "
    "the arrivals of the lookback.",
    "silver_labels": "Chargebacks reported on one arrival date, first copy of each transaction_id.",
}


def _expectation(kind: str, **kwargs: Any) -> dict[str, Any]:
    return {"type": kind, "kwargs": kwargs, "meta": {}}


def build_suite(name: str) -> dict[str, Any]:
    """The suite `name` as GX's ExpectationSuite(**suite) takes it, derived from its contract."""
    contract, layer = GENERATED_SUITES[name]
    columns = [*contract.columns, *LAYER_COLUMNS[layer]]
    if layer == "silver" and contract is TRANSACTIONS_CONTRACT:
        columns.append("event_date")
    out = [_expectation("expect_table_columns_to_match_set", column_set=columns, exact_match=True)]
    not_null = [*contract.required, *(c for c in LAYER_COLUMNS[layer] if c != "run_id")]
    if "event_date" in columns:
        not_null.append("event_date")
    out += [_expectation("expect_column_values_to_not_be_null", column=c) for c in not_null]
    for f in contract.fields:
        if f.kind in _SPARK_TYPES:
            out.append(
                _expectation("expect_column_values_to_be_of_type", column=f.name, type_=_SPARK_TYPES[f.kind])
            )
    for f in contract.fields:
        if f.minimum is not None and f.maximum is not None:
            bounds: dict[str, Any] = {"min_value": f.minimum, "max_value": f.maximum}
            if f.min_exclusive:
                bounds["strict_min"] = True
            if f.max_exclusive:
                bounds["strict_max"] = True
            out.append(_expectation("expect_column_values_to_be_between", column=f.name, **bounds))
        if f.allowed is not None:
            out.append(
                _expectation("expect_column_values_to_be_in_set", column=f.name, value_set=list(f.allowed))
            )
        if f.kind == "string" and f.pattern is not None:
            out.append(_expectation("expect_column_values_to_match_regex", column=f.name, regex=f.pattern))
        if f.max_length is not None:
            out.append(
                _expectation(
                    "expect_column_value_lengths_to_be_between",
                    column=f.name,
                    min_value=1,
                    max_value=f.max_length,
                )
            )
    # The batch gate.
    if contract.row_count_bounds:
        out.append(
            _expectation(
                "expect_table_row_count_to_be_between",
                min_value={"$PARAMETER": "min_rows"},
                max_value={"$PARAMETER": "max_rows"},
            )
        )
    if layer == "silver":
        out += [
            _expectation("expect_column_values_to_be_unique", column=c) for c in contract.unique_in_silver
        ]
    return {
        "name": name,
        "meta": {"notes": _NOTES[name], "generated_from": "pipelines/contracts.py"},
        "expectations": out,
    }


def suite_text(name: str) -> str:
    return json.dumps(build_suite(name), indent=2) + "\n"


def write_suites(suites_dir: Path) -> list[Path]:
    """(Re)write every generated suite file in `suites_dir`."""
    suites_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in GENERATED_SUITES:
        path = suites_dir / f"{name}.json"
        path.write_text(suite_text(name))
        written.append(path)
    return written


if __name__ == "__main__":  # python -m pipelines.suites [suites_dir]
    target = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).resolve().parent.parent / "great_expectations"
    )
    for path in write_suites(target):
        print(path.name)
