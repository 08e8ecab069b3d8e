"""The bundled column-pair counts (pipelines/gx_bundles.py) against GX's own providers: every pair
expectation, every `ignore_row_if`, on rows that pass, fail, hold NULLs on one side or both; and what the
bundling buys, counted in Spark jobs. Uses the session's `spark` (tests/conftest.py); seconds."""

from __future__ import annotations

import pytest

from pipelines import gx_bundles

pytestmark = pytest.mark.integration

ROWS = [(3.0, 1.0), (1.0, 3.0), (2.0, 2.0), (None, 1.0), (1.0, None), (None, None), (5.0, 4.0)]
RULES = ("both_values_are_missing", "either_value_is_missing", "neither")
PAIRS = [
    ("expect_column_pair_values_a_to_be_greater_than_b", {}),
    ("expect_column_pair_values_a_to_be_greater_than_b", {"or_equal": True}),
    ("expect_column_pair_values_a_to_be_greater_than_b", {"mostly": 0.5}),
    ("expect_column_pair_values_to_be_equal", {}),
    ("expect_column_pair_values_to_be_in_set", {"value_pairs_set": [(3.0, 1.0), (2.0, 2.0)]}),
]


@pytest.fixture(scope="module")
def pairs(spark):
    yield spark.createDataFrame(ROWS, "a double, b double")
    gx_bundles.install()  # as the pipeline leaves it


def _batch(df):
    """A batch on an engine of its own: an engine keeps the metrics it computed, and a second run on it
    would read the first one's values instead of computing them."""
    import great_expectations as gx

    source = gx.get_context(mode="ephemeral").data_sources.add_spark("pairs", persist=False)
    definition = source.add_dataframe_asset("pairs").add_batch_definition_whole_dataframe("whole")
    return definition.get_batch(batch_parameters={"dataframe": df})


def _outcome(df, kind: str, kwargs: dict, rule: str) -> dict:
    import great_expectations.expectations as gxe

    batch = _batch(df)
    name = "".join(part.title() for part in kind.removeprefix("expect_").split("_"))
    expectation = getattr(gxe, f"Expect{name}")(column_A="a", column_B="b", ignore_row_if=rule, **kwargs)
    result = batch.validate(expectation, result_format="COMPLETE")
    return {"success": result.success, "result": result.result, "error": result.exception_info}


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize(("kind", "kwargs"), PAIRS, ids=lambda v: str(v)[:40])
def test_bundled_pair_counts_equal_gx_own(pairs, kind, kwargs, rule):
    gx_bundles.uninstall()
    own = _outcome(pairs, kind, kwargs, rule)
    gx_bundles.install()
    bundled = _outcome(pairs, kind, kwargs, rule)
    assert own["error"].get("raised_exception") is False, own["error"]
    assert bundled == own
    assert own["result"]["unexpected_count"] > 0  # the frame has failing rows for every pair


def test_a_pair_costs_no_query_of_its_own(spark, pairs):
    """Four pairs (four distinct metrics: `mostly` does not make another metric, the order of the columns
    does) beside a column check: with the bundle, one aggregation per round of GX's metric graph
    (two rounds here: the row count, then every count); GX's own providers add two filtered counts per
    pair. Adaptive execution off, as pipelines.validation runs suites, so that a query is one job."""
    import great_expectations.expectations as gxe
    from great_expectations.core.expectation_suite import ExpectationSuite

    suite = ExpectationSuite(
        name="pairs",
        expectations=[
            gxe.ExpectColumnValuesToNotBeNull(column="a", mostly=0.1),
            *(
                kind(column_A=a, column_B=b, mostly=0.1)
                for kind in (gxe.ExpectColumnPairValuesAToBeGreaterThanB, gxe.ExpectColumnPairValuesToBeEqual)
                for a, b in (("a", "b"), ("b", "a"))
            ),
        ],
    )

    def jobs(group: str) -> int:
        spark.conf.set("spark.sql.adaptive.enabled", "false")
        spark.sparkContext.setJobGroup(group, group)
        try:
            _batch(pairs).validate(
                suite, result_format={"result_format": "BASIC", "partial_unexpected_count": 0}
            )
        finally:
            spark.sparkContext.setJobGroup("other", "")
            spark.conf.set("spark.sql.adaptive.enabled", "true")
        return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))

    gx_bundles.uninstall()
    own = jobs("pairs-own")
    gx_bundles.install()
    bundled = jobs("pairs-bundled")
    assert bundled == 2
    assert own == bundled + 2 * 4
