"""Great Expectations (GX Core 1.x) validation of Spark DataFrames against the packaged suites
(pipelines/expectations/, read by `pipelines.suites.load_suite`). Results and data docs go under
$MLOPS_HOME/gx."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from core.errors import DataValidationError
from pipelines.spark import adaptive_execution_off
from pipelines.suites import load_suite

log = logging.getLogger(__name__)

# GX's default result format also fetches examples of the unexpected values of every column expectation,
# passed or not: one or two Spark jobs more per expectation, on top of the few aggregations that GX bundles
# all counts into (one per column). A suite therefore runs first with counts and observed values only; one
# that fails runs again with the default format, so that the error and the data docs show the values at
# fault (measured: docs/benchmarks.md).
COUNTS_ONLY = {"result_format": "BASIC", "partial_unexpected_count": 0}


@functools.cache
def _context(project_root: str):
    from great_expectations.data_context.types.base import ProgressBarsConfig

    import great_expectations as gx
    from pipelines import gx_bundles

    gx_bundles.install()  # column-pair counts inside the round's one aggregation (pipelines/gx_bundles.py)
    context = gx.get_context(mode="file", project_root_dir=project_root)
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    context.variables.save()
    return context


def validate(
    df: DataFrame, suite_name: str, project_root: Path, parameters: dict[str, Any]
) -> dict[str, Any]:
    """Validate `df` with the packaged suite `suite_name`; raise DataValidationError naming each failed
    expectation, its column and the observed value (with examples of unexpected values). Results and data
    docs go to `project_root`/gx. Returns a summary with the data docs location."""
    from great_expectations.core.expectation_suite import ExpectationSuite

    import great_expectations as gx

    context = _context(str(project_root))
    suite = context.suites.add_or_update(ExpectationSuite(**load_suite(suite_name)))
    # persist=False: GX would otherwise cache every validated DataFrame and never release it (a leak in a
    # long-lived worker); uncached, the suite also runs faster (measured: see docs/benchmarks.md).
    source = context.data_sources.add_or_update_spark("spark", persist=False)
    asset = next((a for a in source.assets if a.name == suite_name), None) or source.add_dataframe_asset(
        suite_name
    )
    batch = next((b for b in asset.batch_definitions if b.name == "whole"), None)
    batch = batch or asset.add_batch_definition_whole_dataframe("whole")
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(data=batch, suite=suite, name=suite_name)
    )
    data = {"dataframe": df}
    # GX's queries are global aggregations and filtered counts over one scan.
    with adaptive_execution_off(df.sparkSession):
        result = definition.run(
            batch_parameters=data, expectation_parameters=parameters, result_format=COUNTS_ONLY
        )
        if not result.success:
            result = definition.run(batch_parameters=data, expectation_parameters=parameters)
    docs = context.build_data_docs().get("local_site", "")
    log.info("GX %s: success=%s; data docs at %s", suite_name, result.success, docs)
    failures = [describe_failure(r) for r in result.results if not r.success]
    summary = {
        "suite": suite_name,
        "success": bool(result.success),
        "evaluated": result.statistics.get("evaluated_expectations"),
        "failed": len(failures),
        "failures": failures,
        # each expectation's outcome, for the validated dataset's OpenLineage data-quality facet
        "assertions": [
            {
                "expectation": r.expectation_config.type,
                "column": r.expectation_config.kwargs.get("column"),
                "success": bool(r.success),
            }
            for r in result.results
        ],
        "data_docs": docs,
    }
    if failures:
        listing = "\n".join(f"  - {f}" for f in failures)
        raise DataValidationError(
            f"GX suite {suite_name}: {len(failures)} of {summary['evaluated']} expectations failed:\n"
            f"{listing}\nData docs: {docs}"
        )
    return summary


def describe_failure(result) -> str:
    config = result.expectation_config
    kwargs = config.kwargs
    where = f"column '{kwargs['column']}'" if "column" in kwargs else "the table"
    details = result.result or {}
    if details.get("observed_value") is not None:
        observed = f"observed {details['observed_value']!r}"
    elif details.get("unexpected_count") is not None:
        sample = details.get("partial_unexpected_list", [])[:5]
        observed = f"{details['unexpected_count']} unexpected value(s), e.g. {sample!r}"
    elif result.exception_info and result.exception_info.get("raised_exception"):
        observed = f"could not evaluate: {result.exception_info.get('exception_message')}"
    else:
        observed = "no observation"
    expected = {k: v for k, v in kwargs.items() if k not in ("column", "batch_id")}
    return f"{config.type} on {where}: {observed} (expected {expected})"
