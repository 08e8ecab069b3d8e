"""Jobs: the functions both the `mlops` CLI and the Airflow tasks call.

Each job resolves its locations from the settings (the composition root) and delegates to the pure or
I/O code in pipelines/, training/ and features/. Nothing here runs at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path

from mlops.clock import StageClock
from mlops.settings import get_settings


def land_synthetic(
    start: date,
    days: int,
    rows_per_day: int,
    seed: int,
    fmt: str = "csv",
    faults: str | None = None,
    landing: Path | None = None,
    customers: int | None = None,
    merchants: int | None = None,
    rows_per_file: int = 1_000_000,
    feed_start: date | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict]:
    """Write synthetic arrival dates into the landing zone; return their manifests."""
    from pipelines.synthetic.faults import parse_faults
    from pipelines.synthetic.landing import GenerateRequest, generate_landing

    request = GenerateRequest(
        start=start,
        days=days,
        rows_per_day=rows_per_day,
        seed=seed,
        landing=landing or get_settings().landing,
        fmt=fmt,  # type: ignore[arg-type]
        faults=parse_faults(faults),
        customers=customers,
        merchants=merchants,
        rows_per_file=rows_per_file,
        feed_start=feed_start,
    )
    return generate_landing(request, progress=progress)


INGEST_STEPS = (
    "ingest_to_bronze",
    "validate_bronze",
    "build_silver",
    "validate_silver",
    "ingest_labels",
    "ingest",
)


def ingest_step(step: str, day: date, run_id: str | None = None) -> dict:
    """Run one ingestion step (or `ingest`, all of them) for an arrival date."""
    import uuid

    from pipelines.ingest import job

    if step not in INGEST_STEPS:
        raise ValueError(f"unknown ingest step {step!r}; steps: {', '.join(INGEST_STEPS)}")
    settings = get_settings()
    settings.ensure_dirs()
    function = getattr(job, step)
    if step.startswith("validate"):
        return function(settings, day)
    return function(settings, day, run_id or f"cli-{uuid.uuid4().hex[:12]}")


FEATURE_STEPS = ("build_gold", "validate_gold", "version_gold", "materialize", "features")


def features_step(step: str, day: date) -> dict:
    """Run one features step (or `features`, all of them) for an event date."""
    from pipelines.features import job

    if step not in FEATURE_STEPS:
        raise ValueError(f"unknown features step {step!r}; steps: {', '.join(FEATURE_STEPS)}")
    settings = get_settings()
    settings.ensure_dirs()
    if step == "build_gold":
        return job.build_gold(settings, day)
    if step == "validate_gold":
        return {"validation": job.validate_gold(settings, day)}
    if step == "version_gold":
        return job.version_gold(settings, day)
    if step == "materialize":
        return _materialize(settings, day)
    clock = StageClock()  # seconds per step, as the DAG tasks: the in-process baseline reports them
    record = clock.run("build_gold", lambda: job.build_gold(settings, day))
    record["validation"] = clock.run("validate_gold", lambda: job.validate_gold(settings, day))
    record.update(clock.run("version_gold", lambda: job.version_gold(settings, day)))
    record.update(clock.run("materialize", lambda: _materialize(settings, day)))
    record["seconds_per_step"] = clock.seconds
    record["rows_gold"] = record["rows_customer_features"] + record["rows_merchant_features"]
    record["status"] = "ok"
    return record


def _materialize(settings, day: date) -> dict:
    """Apply the Feast definitions (idempotent) and load the date's interval into the online store."""
    from datetime import UTC, datetime, time, timedelta

    from features import store

    store.apply(settings)
    start = datetime.combine(day, time.min, tzinfo=UTC)
    views = store.materialize(settings, start, start + timedelta(days=1))
    return {
        "rows_materialized": sum(v.rows_written for v in views),
        "materialized": {v.feature_view: v.rows_written for v in views},
    }
