"""The GX suites: where they live, how they are read, and the generated ones' source (pipelines/contracts.py).

The suites are package data of `pipelines`: JSON files in pipelines/expectations/, one per table and layer,
shipped inside the wheel and read with `importlib.resources` by `load_suite`, the one reader (validation
and the tests go through it). A path relative to the source checkout would not exist in an installed copy
(an image installs the wheel), so nothing locates them through the repository.

The suites are code, not configuration: there is no setting that points elsewhere (the former `suites_dir`
setting is gone). The landing suites are generated from the data contracts and checked against them by a
test, the quarantine rules derive from the same contracts, and a model's lineage records which suites its
gold passed beside the commit of the code; suites swapped in by a deployment would make both claims false.
Changing a suite is a change to this package, reviewed and released like any other.

The files stay files (reviewed in a diff, dependencies of the DVC stages, shown in data docs), but every
suite is written by this module, never by hand: `python -m pipelines.suites` rewrites them in the package's
folder, and tests/unit/test_contract_suites.py fails when a file and its source disagree. The three landing
suites come from the data contracts (pipelines/contracts.py), the two gold suites (`gold_<table>.json`)
from the feature declarations (pipelines/gold/contract.py FEATURES).

A suite has two parts. The row-level expectations mirror the row rules of ingestion, so they are a
cross-check that must pass (every row that fails one was quarantined before the table was written). The
batch expectations are the gate: row-count bounds against the previous arrival date (GX parameters
`min_rows`/`max_rows`, set by the pipeline) and uniqueness of the key in silver.
"""

from __future__ import annotations

import importlib.resources
import json
import sys
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from pipelines.contracts import LABELS_CONTRACT, TRANSACTIONS_CONTRACT, TableContract
from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE

# The suites' folder inside the `pipelines` package: pipelines/expectations/<suite name>.json.
SUITES_PACKAGE = "pipelines"
SUITES_FOLDER = "expectations"

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


def gold_suite_name(table: str) -> str:
    """The suite that validates the gold table `table` (generated from the feature declarations)."""
    return f"gold_{table}"


# Gold suite name -> the entity whose declared features (pipelines/gold/contract.py FEATURES) it checks.
GOLD_SUITES: dict[str, str] = {
    gold_suite_name(CUSTOMER_TABLE): "customer",
    gold_suite_name(MERCHANT_TABLE): "merchant",
}


# Every suite the pipeline validates with: the generated landing suites, then the gold ones.
SUITE_NAMES: tuple[str, ...] = (
    *GENERATED_SUITES,
    *GOLD_SUITES,
)
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


# What a gold value of each aggregation may be (pipelines/gold/contract.py AGGREGATIONS), as GX bounds: a
# window includes the row's own transaction, so a count of transactions and a distinct count are at least 1;
# USD amounts are positive, so sums, means, deviations and maxima are not negative; a share is in [0, 1].
_GOLD_BOUNDS: dict[str, dict[str, Any]] = {
    "count": {"min_value": 0},
    "sum": {"min_value": 0},
    "mean": {"min_value": 0},
    "std": {"min_value": 0},
    "distinct_count": {"min_value": 1},
    "share": {"min_value": 0, "max_value": 1},
    "per_transaction": {"min_value": 0},
    "time_since_previous": {"min_value": 0},
    "max": {"min_value": 0},
}
# Aggregations that may be null: a deviation of fewer than two values, no previous transaction in reach.
_GOLD_NULLABLE = ("std", "time_since_previous")
# Aggregations that grow with the window over the same rows, exactly (integers: no rounding between the
# range windows and the incremental ones): checked nested, each window against the next shorter one.
_GOLD_NESTED = ("count", "distinct_count")


def build_gold_suite(name: str) -> dict[str, Any]:
    """The gold suite `name` from the entity's declared features: the key (present, a pseudonym), the
    timestamps present, each feature's bounds and nulls by its aggregation, windows of one measure nested."""
    from core import pseudonym
    from pipelines.gold.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP, WINDOWS, features_of

    entity = GOLD_SUITES[name]
    key = f"{entity}_id"
    out = [
        _expectation("expect_column_values_to_not_be_null", column=key),
        {
            **_expectation(
                "expect_column_values_to_match_regex",
                column=key,
                regex=pseudonym.PATTERNS[pseudonym.COLUMNS[key]],
            ),
            "meta": {"notes": "a pseudonym (core/pseudonym.py): gold never holds a raw id"},
        },
        _expectation("expect_column_values_to_not_be_null", column=EVENT_TIMESTAMP),
        _expectation("expect_column_values_to_not_be_null", column=CREATED_TIMESTAMP),
    ]
    features = features_of(entity)
    for f in features:
        if f.aggregation not in _GOLD_NULLABLE:
            out.append(_expectation("expect_column_values_to_not_be_null", column=f.name))
        bounds = dict(_GOLD_BOUNDS[f.aggregation])
        if f.aggregation == "count" and f.input == "transaction":
            bounds["min_value"] = 1  # the row counts its own transaction
        out.append(_expectation("expect_column_values_to_be_between", column=f.name, **bounds))
    order: dict[str | None, int] = {window: n for n, window in enumerate(WINDOWS)}
    order[None] = -1  # no window: never nested
    for f in features:
        if f.aggregation not in _GOLD_NESTED or f.window is None:
            continue
        shorter = [
            g
            for g in features
            if (g.input, g.aggregation) == (f.input, f.aggregation)
            and g.window is not None
            and order[g.window] < order[f.window]
        ]
        if shorter:
            inner = max(shorter, key=lambda g: order[g.window])
            out.append(
                _expectation(
                    "expect_column_pair_values_a_to_be_greater_than_b",
                    column_A=f.name,
                    column_B=inner.name,
                    or_equal=True,
                )
            )
    notes = (
        f"{entity.title()} aggregates as of each transaction, one expectation set per declared feature: "
        "present unless its aggregation may be null (a deviation, the time since the previous), bounded by "
        "its aggregation, windows of one count nested."
    )
    return {
        "name": name,
        "meta": {"notes": notes, "generated_from": "pipelines/gold/contract.py"},
        "expectations": out,
    }


def build_suite(name: str) -> dict[str, Any]:
    """The suite `name` as GX's ExpectationSuite(**suite) takes it, derived from its contract (a landing
    table's) or from the feature declarations (a gold table's)."""
    if name in GOLD_SUITES:
        return build_gold_suite(name)
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
        # Stored values: bronze onward holds an identifier's pseudonym, never the raw id landing sent.
        if f.kind == "string" and f.stored_pattern is not None:
            out.append(
                _expectation("expect_column_values_to_match_regex", column=f.name, regex=f.stored_pattern)
            )
        if f.stored_max_length is not None:
            out.append(
                _expectation(
                    "expect_column_value_lengths_to_be_between",
                    column=f.name,
                    min_value=1,
                    max_value=f.stored_max_length,
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


def suites_folder() -> Traversable:
    """The packaged suites' folder (a plain folder once the wheel is installed, or in a checkout)."""
    return importlib.resources.files(SUITES_PACKAGE) / SUITES_FOLDER


def suite_resource(name: str) -> Traversable:
    """The packaged file of suite `name`."""
    return suites_folder() / f"{name}.json"


def load_suite(name: str) -> dict[str, Any]:
    """The packaged suite `name` as GX's ExpectationSuite(**suite) takes it: the one reader of the suites."""
    resource = suite_resource(name)
    if not resource.is_file():
        known = ", ".join(SUITE_NAMES)
        raise FileNotFoundError(
            f"GX suite {name!r} is not in the installed package (looked for {resource}); the suites the "
            f"pipeline uses are {known}. A name outside that list is a bug in the caller; a listed one "
            f"missing means the package was built without pipelines/{SUITES_FOLDER}/: reinstall it, or in a "
            "checkout run `python -m pipelines.suites` (landing suites) or restore the file from git (gold)."
        )
    return json.loads(resource.read_text(encoding="utf-8"))


def write_suites(suites_dir: Path) -> list[Path]:
    """(Re)write every generated suite file in `suites_dir`."""
    suites_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in SUITE_NAMES:
        path = suites_dir / f"{name}.json"
        path.write_text(suite_text(name))
        written.append(path)
    return written


def _package_folder() -> Path:
    """The suites' folder as a real folder to write into (this package's source, in a checkout)."""
    folder = suites_folder()
    if not isinstance(folder, Path):
        raise SystemExit(f"pipelines is not installed as a folder ({folder}); pass the folder to write into")
    return folder


if __name__ == "__main__":  # python -m pipelines.suites [suites_dir]; default: pipelines/expectations/
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else _package_folder()
    for path in write_suites(target):
        print(path.name)
