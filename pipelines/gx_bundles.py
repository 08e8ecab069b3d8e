"""Column-pair expectations computed inside GX's one aggregation per round, on Spark.

GX's Spark engine bundles every column expectation's counts into one `df.agg(...)` per round of its metric
graph (one Spark job for a whole suite's null, range and regex checks), but a column-pair expectation
(`expect_column_pair_values_a_to_be_greater_than_b`, `..._to_be_equal`, `..._to_be_in_set`) gets its two
counts, the rows it looks at and the rows that fail, from a filtered `df.count()` each: two queries, four
Spark jobs with adaptive execution, per pair. The gold suites check the nesting of every windowed measure
with such pairs, so they were 16 of the 26 jobs of validating one day's gold (docs/benchmarks.md, "Spark
jobs per step").

`install()` registers, for the Spark engine only, both counts of every column-pair metric as aggregate
partials, the protocol GX itself uses for its column metrics: `sum(when(...))` expressions that GX puts
into the round's one aggregation. The values are the same counts over the same rows: the rows that the
pair's `ignore_row_if` leaves out are left out by the expression (GX filters them before its count), and a
condition that is NULL counts as not failing, as GX's `filter(condition == True)` does. Nothing else changes:
the expectations, their results, the failing rows' examples (fetched by GX's own providers when a suite is
run again to describe a failure) and the data docs.

tests/integration/test_gx_bundles.py holds every count against GX's own providers (`uninstall()` restores
them) on frames with failing, NULL and ignored rows, for each `ignore_row_if`; the registration reaches into
GX's metric registry, so great-expectations is pinned below its next minor (pyproject.toml).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

UNEXPECTED_COUNT = "unexpected_count"
FILTERED_ROW_COUNT = "filtered_row_count"
AGGREGATE = "aggregate_fn"
# Keys of the pair's compute domain that only its own counts read: left out of the domain an aggregate is
# bundled under, so that the pair's counts join the table's round instead of a query of their own.
PAIR_ONLY_KEYS = ("ignore_row_if",)

_saved: dict[str, Any] = {}


def _pair_metric_classes() -> list[Any]:
    from great_expectations.expectations.metrics.map_metric_provider.column_pair_map_metric_provider import (
        ColumnPairMapMetricProvider,
    )

    found, todo = [], list(ColumnPairMapMetricProvider.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if getattr(cls, "condition_metric_name", None):
            found.append(cls)
    return found


def _ignored(domain_kwargs: dict, column_a: str, column_b: str):
    """The rows GX's Spark engine leaves out of a pair's domain (SparkDFExecutionEngine.get_domain_records),
    or None when it leaves out none."""
    from pyspark.sql import functions as F

    rule = domain_kwargs.get("ignore_row_if", "both_values_are_missing")
    a, b = F.col(column_a).isNull(), F.col(column_b).isNull()
    if rule == "both_values_are_missing":
        return a & b
    if rule == "either_value_is_missing":
        return a | b
    if rule == "neither":
        return None
    raise ValueError(f'Unrecognized value of ignore_row_if ("{rule}").')


def _partial(counted: str):
    """The aggregate partial of one pair count: `counted` is "unexpected" (rows kept that fail) or "kept"."""

    def provider(cls, execution_engine, metric_domain_kwargs, metric_value_kwargs, metrics, **kwargs):
        from great_expectations.expectations.metrics.util import get_dbms_compatible_metric_domain_kwargs
        from pyspark.sql import functions as F

        condition, compute, accessor = metrics["unexpected_condition"]
        accessor = get_dbms_compatible_metric_domain_kwargs(
            metric_domain_kwargs=accessor, batch_columns_list=metrics["table.columns"]
        )
        ignored = _ignored(compute, accessor["column_A"], accessor["column_B"])
        kept = F.lit(True) if ignored is None else ~ignored
        counted_rows = (kept & condition) if counted == "unexpected" else kept
        expression = F.sum(F.when(counted_rows, 1).otherwise(0))
        domain = {k: v for k, v in compute.items() if k not in PAIR_ONLY_KEYS}
        return expression, domain, accessor

    provider.__name__ = f"_bundled_pair_{counted}_count"
    return provider


@functools.cache
def _bundled_class(base: type) -> type:
    """`base` (a column-pair metric class) with the filtered row count taken from an aggregate partial.
    Made with type.__new__, so that GX's metaclass does not register the base's metrics a second time
    under the copy."""
    from great_expectations.core.metric_function_types import MetricPartialFunctionTypeSuffixes
    from great_expectations.validator.metric_configuration import MetricConfiguration

    total, partial = f".{FILTERED_ROW_COUNT}", f".{FILTERED_ROW_COUNT}.{AGGREGATE}"

    @classmethod  # type: ignore[misc]
    def _get_evaluation_dependencies(
        cls, metric, configuration=None, execution_engine=None, runtime_configuration=None
    ):
        dependencies = base._get_evaluation_dependencies.__func__(  # type: ignore[attr-defined]
            cls, metric, configuration, execution_engine, runtime_configuration
        )
        name = metric.metric_name
        value_kwargs = {k: v for k, v in metric.metric_value_kwargs.items() if k != "result_format"}
        if name.endswith(total):
            dependencies.pop("unexpected_condition", None)
            dependencies["metric_partial_fn"] = MetricConfiguration(
                metric_name=f"{name}.{AGGREGATE}",
                metric_domain_kwargs=metric.metric_domain_kwargs,
                metric_value_kwargs=value_kwargs,
            )
        elif name.endswith(partial):
            dependencies["unexpected_condition"] = MetricConfiguration(
                metric_name=f"{name[: -len(partial)]}.{MetricPartialFunctionTypeSuffixes.CONDITION.value}",
                metric_domain_kwargs=metric.metric_domain_kwargs,
                metric_value_kwargs=value_kwargs,
            )
        return dependencies

    namespace = {"_get_evaluation_dependencies": _get_evaluation_dependencies, "__module__": __name__}
    return type.__new__(type(base), f"Bundled{base.__name__}", (base,), namespace)


def install() -> None:
    """Register the bundled pair counts for the Spark engine (idempotent)."""
    from great_expectations.core.metric_function_types import (
        MetricFunctionTypes,
        MetricPartialFunctionTypes,
    )
    from great_expectations.execution_engine import SparkDFExecutionEngine
    from great_expectations.expectations import registry

    if _saved:
        return
    # GX logs a warning for each provider replaced; the replacement is the point here.
    quiet = logging.getLogger(registry.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        _register(registry, SparkDFExecutionEngine, MetricFunctionTypes, MetricPartialFunctionTypes)
    finally:
        quiet.setLevel(level)


def _register(registry, spark_engine, value_type, partial_type) -> None:
    engine = spark_engine.__name__
    for base in _pair_metric_classes():
        cls = _bundled_class(base)
        for count, counted in ((UNEXPECTED_COUNT, "unexpected"), (FILTERED_ROW_COUNT, "kept")):
            name = f"{base.condition_metric_name}.{count}"
            entry = registry._registered_metrics.get(name)
            if entry is None or engine not in entry["providers"] or name in _saved:
                continue  # (a metric class's subclasses share its metric names: registered once)
            _saved[name] = entry["providers"][engine]
            keys = {"metric_domain_keys": entry["metric_domain_keys"], "execution_engine": spark_engine}
            value_keys = tuple(k for k in entry["metric_value_keys"] if k != "result_format")
            registry.register_metric(
                metric_name=f"{name}.{AGGREGATE}",
                metric_value_keys=value_keys,
                metric_class=cls,
                metric_provider=_partial(counted),
                metric_fn_type=partial_type.AGGREGATE_FN,
                **keys,
            )
            registry.register_metric(
                metric_name=name,
                metric_value_keys=entry["metric_value_keys"],
                metric_class=cls,
                metric_provider=None,
                metric_fn_type=value_type.VALUE,
                **keys,
            )


def uninstall() -> None:
    """GX's own providers back (the contract test compares the two)."""
    from great_expectations.execution_engine import SparkDFExecutionEngine
    from great_expectations.expectations import registry

    engine = SparkDFExecutionEngine.__name__
    for name, provider in _saved.items():
        registry._registered_metrics[name]["providers"][engine] = provider
        registry._registered_metrics.pop(f"{name}.{AGGREGATE}", None)
    _saved.clear()
