"""The GX suites are generated, the landing tables' from their data contracts and gold's from the feature
declarations: a suite file that disagrees with its source (edited by hand, or the source changed without
`python -m pipelines.suites`) fails here."""

from __future__ import annotations

import pytest

from core import pseudonym
from pipelines.contracts import LABELS_CONTRACT, TRANSACTIONS_CONTRACT
from pipelines.suites import (
    SUITE_NAMES,
    build_suite,
    load_suite,
    suite_resource,
    suites_folder,
)


@pytest.mark.parametrize("name", sorted(SUITE_NAMES))
def test_each_suite_file_is_what_its_contract_generates(name):
    assert suite_resource(name).is_file(), f"{name}.json is missing: run `python -m pipelines.suites`"
    assert load_suite(name) == build_suite(name), (
        f"{name}.json disagrees with its source (pipelines/contracts.py, pipelines/gold/contract.py "
        "FEATURES): run `python -m pipelines.suites`"
    )


def test_the_packaged_suites_are_exactly_the_ones_the_pipeline_uses():
    """A suite file no step validates with is dead weight (or a step that lost it); a name without a file
    fails the step at run time."""
    shipped = {r.name.removesuffix(".json") for r in suites_folder().iterdir() if r.name.endswith(".json")}
    assert shipped == set(SUITE_NAMES)
    for name in SUITE_NAMES:
        assert load_suite(name)["name"] == name


def test_a_suite_that_is_not_packaged_is_refused_with_the_known_names():
    with pytest.raises(
        FileNotFoundError, match=r"'gold_nothing'.*bronze_transactions.*gold_merchant_features"
    ):
        load_suite("gold_nothing")


@pytest.mark.parametrize("contract", [TRANSACTIONS_CONTRACT, LABELS_CONTRACT], ids=lambda c: c.name)
def test_every_string_field_is_constrained_so_no_stray_character_passes(contract):
    """A string field without a pattern or a set of allowed values would let a control character, a
    trailing space or a look-alike letter through unquarantined."""
    loose = [
        f.name for f in contract.fields if f.kind == "string" and f.pattern is None and f.allowed is None
    ]
    assert loose == []


def test_the_bronze_suite_checks_every_id_pattern_the_row_rules_quarantine():
    kinds = {
        (e["type"], e["kwargs"].get("column")): e["kwargs"]
        for e in build_suite("bronze_transactions")["expectations"]
    }
    assert kinds[("expect_column_values_to_match_regex", "transaction_id")]["regex"] == (
        TRANSACTIONS_CONTRACT.field("transaction_id").pattern
    )
    # a person's or a business's id is held as its pseudonym from bronze on: the suite wants that form
    for column, kind in pseudonym.COLUMNS.items():
        assert TRANSACTIONS_CONTRACT.field(column).pseudonym == kind
        assert kinds[("expect_column_values_to_match_regex", column)]["regex"] == pseudonym.PATTERNS[kind]
        assert kinds[("expect_column_value_lengths_to_be_between", column)]["max_value"] == (
            pseudonym.STORED_LENGTH
        )
    for layer_suite, table_column in (("gold_customer_features", "customer_id"),
                                      ("gold_merchant_features", "merchant_id")):  # fmt: skip
        regexes = {
            e["kwargs"]["column"]: e["kwargs"]["regex"]
            for e in load_suite(layer_suite)["expectations"]
            if e["type"] == "expect_column_values_to_match_regex"
        }
        assert regexes[table_column] == pseudonym.PATTERNS[pseudonym.COLUMNS[table_column]]
    assert ("expect_column_values_to_be_unique", "transaction_id") not in kinds  # a silver (batch) rule
    assert ("expect_column_values_to_be_unique", "transaction_id") in {
        (e["type"], e["kwargs"].get("column")) for e in build_suite("silver_labels")["expectations"]
    }
