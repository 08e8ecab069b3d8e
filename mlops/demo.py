"""The main job on the embedded stack: land a synthetic feed, ingest and build features day by day, train
and gate a model, then land one more day and run the chain again so the gate decides on a challenger.

Every stage calls the same functions the DAG tasks call (mlops.jobs, training.steps). Progress goes to a
rich console; the summary dictionary is what `mlops demo --json` prints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import date, timedelta

from rich.console import Console
from rich.table import Table

from mlops.settings import Settings

DEMO_FAULTS = "duplicates=0.01,malformed=0.002,nulls=0.002"


class StageClock:
    """Seconds per stage, summed over the days."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, stage: str, step: Callable[[], dict]) -> dict:
        started = time.perf_counter()
        result = step()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started
        return result


def run_demo(
    settings: Settings, start: date, days: int, rows_per_day: int, seed: int, epochs: int, console: Console
) -> dict:
    from mlops.jobs import features_step, ingest_step, land_synthetic
    from training import steps
    from training.cli import train_config

    if days < 2:
        raise ValueError(
            "the demo needs at least 2 days: one to train the champion, one more for a challenger"
        )
    settings.ensure_dirs()
    clock = StageClock()
    started = time.perf_counter()
    manifests = clock.run(
        "land",
        lambda: {
            "manifests": land_synthetic(
                start=start, days=days, rows_per_day=rows_per_day, seed=seed, faults=DEMO_FAULTS
            )
        },
    )["manifests"]
    console.print(f"landed {days} arrival dates in {settings.landing}")
    config = train_config(epochs=epochs)
    daily: list[dict] = []
    retrains: list[dict] = []

    def through_features(day: date) -> None:
        console.print(f"{day}: ingest (Spark -> bronze + quarantine -> GX -> silver) ...")
        ingested = clock.run("ingest", lambda: ingest_step("ingest", day, run_id=f"demo-{day}"))
        console.print(f"{day}: features (gold -> GX -> DVC -> Feast online store) ...")
        built = clock.run("features", lambda: features_step("features", day))
        daily.append({"date": day.isoformat(), **_day_row(ingested, built)})

    def retrain(day: date) -> None:
        console.print(
            f"retrain as of {day}: training set -> train -> evaluate -> register -> gate -> ONNX ..."
        )
        record = clock.run("retrain", lambda: steps.retrain(settings, day, config, dag_id="mlops-demo"))
        retrains.append(record)

    dates = [start + timedelta(days=i) for i in range(days)]
    for day in dates[:-1]:
        through_features(day)
    retrain(dates[-2])
    console.print(f"one more day arrives: {dates[-1]}")
    through_features(dates[-1])
    retrain(dates[-1])

    _print_tables(console, daily, retrains, clock, settings)
    return {
        "status": "ok",
        "landing": str(settings.landing),
        "dates": [m["arrival_date"] for m in manifests],
        "rows_written": sum(m["transactions"]["rows_written"] for m in manifests),
        "rows_silver": sum(d["rows_silver"] for d in daily),
        "rows_quarantined": sum(d["rows_quarantined"] for d in daily),
        "dataset_revs": [d["dataset_rev"] for d in daily],
        "rows_materialized": sum(d["rows_materialized"] for d in daily),
        "retrains": [_retrain_row(r) for r in retrains],
        "champion_version": retrains[-1].get("champion_version"),
        "seconds_per_stage": clock.seconds,
        "seconds": time.perf_counter() - started,
    }


def _day_row(ingested: dict, built: dict) -> dict:
    return {
        "rows_in": ingested["rows_in"],
        "rows_quarantined": ingested["rows_quarantined"],
        "rows_silver": ingested["rows_silver"],
        "rows_gold": built["rows_gold"],
        "dataset_rev": built["dataset_rev"],
        "rows_materialized": built["rows_materialized"],
    }


def _retrain_row(record: dict) -> dict:
    keys = ("as_of", "training_set_rev", "model_version", "auc_pr", "champion_auc_pr", "decision", "reason",
            "champion_version", "previous_champion", "run_id", "status")  # fmt: skip
    return {key: record.get(key) for key in keys}


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _print_tables(
    console: Console, daily: list[dict], retrains: list[dict], clock: StageClock, settings
) -> None:
    columns = ("rows_in", "rows_quarantined", "rows_silver", "rows_gold", "dataset_rev", "rows_materialized")
    table = Table(
        "date", "rows in", "quarantined", "silver", "gold rows", "dataset rev (DVC)", "online rows",
        title="data: landing -> silver -> gold -> Feast",
    )  # fmt: skip
    for row in daily:
        table.add_row(row["date"], *(str(row[k]) for k in columns))
    console.print(table)
    columns = ("as_of", "training_set_rev", "model_version", "auc_pr", "champion_auc_pr", "decision",
               "champion_version")  # fmt: skip
    table = Table(
        "as of", "training set", "model", "AUC-PR", "champion AUC-PR", "decision", "champion",
        title="models: train -> gate (holdout AUC-PR)",
    )  # fmt: skip
    for record in retrains:
        row = _retrain_row(record)
        table.add_row(*(_fmt(row[k]) for k in columns))
    console.print(table)
    for record in retrains:
        console.print(
            f"gate, model {record.get('model_version')}: {record.get('decision')}: {record.get('reason')}"
        )
    table = Table("stage", "seconds", title="time per stage")
    for stage, seconds in clock.seconds.items():
        table.add_row(stage, f"{seconds:.1f}")
    console.print(table)
    console.print(
        "Look further: `mlops history` (every gate decision), `mlops rollback`, "
        f"`mlflow ui --backend-store-uri {settings.mlflow_tracking_uri}`"
    )
