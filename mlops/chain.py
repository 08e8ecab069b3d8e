"""The chain's stages for the `mlops` CLI and the in-process demo: the same typed step functions the DAG
tasks call, by the names of those tasks, and each stage's steps in one call, timed as the DAG's tasks are.

The command line names a step with `--step NAME`; the tables below map each name to its function once, so
what a name runs is visible here and a typo is refused with the list of names.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import date
from functools import partial
from typing import TypeVar

from core.clock import StageClock
from core.errors import PipelineError
from core.settings import Settings
from features.materialize import materialize_date
from pipelines.gold import job as gold
from pipelines.ingest import job as ingest
from pipelines.lake import clear_every_replaced
from training.feature_rows import build_feature_rows

IngestStep = Callable[[Settings, date, str], dict]
FeaturesStep = Callable[[Settings, date], dict]
T = TypeVar("T")


def validate_gold(settings: Settings, day: date) -> dict:
    """The gold GX suites, as the record the CLI and the DAG task return."""
    return {"validation": gold.validate_gold(settings, day)}


def features(settings: Settings, day: date) -> dict:
    """Every features step for arrival `day`, as the DAG runs them: plan which event dates to (re)build
    (the date's own, those its late events touch, and those whose inputs changed since they were built),
    then each in order; the seconds of each step summed over the dates (named as the DAG tasks).
    Returns the record of event date `day` with, under `rebuilt`, the records of the other dates."""
    clock = StageClock()
    plan = clock.run("plan_gold", lambda: gold.plan_gold(settings, [day]))
    records, rows = _build_planned(settings, plan, clock)
    record = records.pop(
        day.isoformat(),
        {"event_date": day.isoformat(), "rows_customer_features": 0, "rows_merchant_features": 0},
    )
    record["rebuilt"] = records
    record["plan"] = plan
    record["training_rows"] = rows
    record["seconds_per_step"] = clock.seconds
    record["rows_gold"] = record["rows_customer_features"] + record["rows_merchant_features"]
    record["status"] = "ok"
    return record


Progress = Callable[[int, int, date, str, dict], None]


def backfill(settings: Settings, progress: Progress | None = None) -> dict:
    """Bring every gold date up to date with no arrival to name: the dates built for other declarations
    (a feature added or changed: its backfill) and those whose inputs changed since they were built, oldest
    first, each through the features steps as the DAG runs them; then their training rows. `progress` is
    called after each date with (its number, how many, the date, why it was rebuilt, its record).
    Returns `{"status": "ok", "plan", "rebuilt": {date: record}, "training_rows", "seconds_per_step"}`;
    with nothing to rebuild, `rebuilt` is empty and the training rows step has no date to build."""
    clock = StageClock()
    plan = clock.run("plan_gold", lambda: gold.plan_gold(settings, []))
    records, rows = _build_planned(settings, plan, clock, progress)
    return {
        "status": "ok",
        "plan": plan,
        "rebuilt": records,
        "training_rows": rows,
        "seconds_per_step": clock.seconds,
    }


def erase(settings: Settings, customer: str, rebuild: bool = True, progress: Progress | None = None) -> dict:
    """A person erased through every layer this product rebuilds: `pipelines.privacy.erase_customer` (landing,
    quarantine, bronze, silver, the scoring log), their online entities (`features.materialize`
    `erase_customers`), then, where silver lost rows, the features backfill, which finds the arrivals whose
    silver changed and rebuilds every gold date that read them (gold, its GX results, a new DVC revision, the
    online store, the training rows). `rebuilt`: each date rebuilt and why. With `rebuild=False` gold still
    holds them; the report says so."""
    from features.materialize import erase_customers
    from pipelines.privacy import customer_id, erase_customer, pseudonym_of
    from serving.erasure import forget_in_service

    customer = customer_id(customer)
    # The scoring service first (every replica): it forgets the person and writes what their scoring had on
    # its way to the scoring log and the online store, which are rewritten next.
    live_state = forget_in_service(settings, customer, pseudonym_of(settings, customer))
    record = erase_customer(settings, customer)
    record["live_state"] = live_state
    if live_state["status"] in ("not_reached", "pending", "no_replica_running"):
        record["not_reached"] = [f"the scoring service: {live_state['why']}", *record["not_reached"]]
    # the online store is the features layer's: past landing the customer is their pseudonym
    known_as = {record["pseudonym"]} if record["pseudonym"] else set()
    record["online_store"] = erase_customers(settings, known_as)
    record["rebuilt"] = {}
    if any(name.startswith("silver/") for name in record["lake"]):
        if rebuild:
            done = backfill(settings, progress)
            record["rebuilt"] = {day: done["plan"]["reasons"][day] for day in done["rebuilt"]}
            # the versions the rebuild replaced, kept a while for readers that opened them, hold their rows
            record["replaced_versions_cleared"] = [
                str(root.relative_to(settings.lake)) for root in clear_every_replaced(settings.lake)
            ]
        else:
            record["not_reached"] = [
                "gold, its DVC revisions and the training rows, until `mlops features backfill` rebuilds it",
                *record["not_reached"],
            ]
    record["held_by"] = held_by(settings, known_as)
    return record


def retention_plan(settings: Settings) -> dict:
    """The cluster's first retention step (the Airflow image): the retentions' floor checked, before anything
    anywhere is deleted, and the newest arrival ingested, which the models' pod counts back from."""
    from pipelines.privacy import newest_ingested
    from pipelines.retention import check_retention

    check_retention(settings)
    newest = newest_ingested(settings)
    return {"newest_ingested": newest.isoformat() if newest else ""}


def retention(settings: Settings, models: dict | None = None) -> dict:
    """Every layer's retention (the `enforce_retention` DAG, `mlops retention`): landing, quarantine and the
    scoring log (pipelines/privacy.py), the lake, the training sets and the DVC revisions but the training
    sets of versions that may serve again (pipelines/retention.py), then those versions' artifacts in MLflow
    (training/retention.py), each counted back from the newest arrival the lake has ingested. Where MLflow
    cannot be imported (the Airflow image carries none) nothing says which versions may serve again: every
    training set's revision is kept, no artifact is removed, and the report says so. `models`: the models'
    part already done where MLflow is (the cluster's pod of the training image, `retention_plan` first):
    its training sets are the ones kept, its report the models' part of this one."""
    from pipelines.privacy import enforce_retention
    from pipelines.versioning import revisions_with_member
    from training.dataset import TRAINING_SET_MEMBER

    if models is not None:
        report = enforce_retention(settings, set(models["protected_training_sets"]))
        report["models"] = models["models"]
        return report
    try:
        from training.retention import RegistryView, expire_model_artifacts, protected_training_sets

        view = RegistryView.read(settings)
        keep, why_kept, unread = protected_training_sets(settings, view), "", None
    except ImportError as exc:  # no MLflow in this image
        keep = revisions_with_member(settings, TRAINING_SET_MEMBER)
        why_kept = "a training set, kept while the registry cannot be read here"
        unread = (
            f"the model registry cannot be read here ({exc}): every training set's DVC revision was kept and "
            "no artifact removed; run `mlops retention` where MLflow is installed (the training image)"
        )
    report = enforce_retention(settings, keep, why_kept)  # a setting too short deletes nothing
    report["models"] = {"artifacts_removed": [], "kept": {}}
    if unread:
        report["models"]["not_read"] = unread
    elif report["newest_ingested"]:
        newest = date.fromisoformat(report["newest_ingested"])
        report["models"] = expire_model_artifacts(settings, newest, view)  # the registry as read above
    return report


def held_by(settings: Settings, pseudonyms: set[str]) -> dict:
    """What still holds these customers after their erasure, by name: the dataset revisions in the DVC remote
    (gold dates, training sets) whose rows name them, and the model versions trained on those training sets.
    They are kept, not rewritten: a revision is its content's hash and a version's training set is its
    record (`mlops reproduce`); they go with retention. An installation whose remote is not a mounted
    folder is said, not read."""
    from pipelines.versioning import revisions_holding

    try:
        revisions = revisions_holding(settings, "customer_id", pseudonyms)
    except PipelineError as exc:
        return {"dataset_revisions": None, "model_versions": None, "not_read": str(exc)}
    try:
        from training.registry import ModelRegistry

        models = ModelRegistry(settings.mlflow_tracking_uri).trained_on(set(revisions)) if revisions else []
    except ImportError as exc:  # no MLflow in this image (the Airflow image)
        return {
            "dataset_revisions": revisions,
            "model_versions": None,
            "not_read": f"the model registry cannot be read here ({exc}): the versions trained on the "
            "training sets named above are those whose lineage.training_set_rev tag names one",
        }
    return {"dataset_revisions": revisions, "model_versions": models}


def _build_planned(
    settings: Settings, plan: dict, clock: StageClock, progress: Progress | None = None
) -> tuple[dict[str, dict], dict]:
    """Each event date of `plan`, oldest first: build, validate, version (unless the date was removed)
    and load online; then the training rows of every one of them (and of the later dates that read them).
    Returns the dates' records and the training rows' record."""
    records: dict[str, dict] = {}
    dates = [date.fromisoformat(d) for d in plan["event_dates"]]
    for number, event_date in enumerate(dates, start=1):
        record = clock.run("build_gold", partial(gold.build_gold, settings, event_date))
        if not record.get("removed"):
            record.update(clock.run("validate_gold", partial(validate_gold, settings, event_date)))
            record.update(clock.run("version_gold", partial(gold.version_gold, settings, event_date)))
        # A removed date is loaded too: its entities leave the online store (or go back to earlier rows).
        record.update(clock.run("materialize", partial(materialize_date, settings, event_date)))
        records[event_date.isoformat()] = record
        if progress is not None:
            progress(number, len(dates), event_date, plan["reasons"][event_date.isoformat()], record)
    return records, clock.run("build_training_rows", partial(build_feature_rows, settings, dates))


INGEST_STEPS: dict[str, IngestStep] = {
    "ingest_to_bronze": ingest.ingest_to_bronze,
    "validate_bronze": lambda settings, day, _run_id: ingest.validate_bronze(settings, day),
    "build_silver": ingest.build_silver,
    "validate_silver": lambda settings, day, _run_id: ingest.validate_silver(settings, day),
    "ingest_labels": ingest.ingest_labels,
    "ingest": ingest.ingest,
}
FEATURES_STEPS: dict[str, FeaturesStep] = {
    "plan_gold": lambda settings, day: gold.plan_gold(settings, [day]),
    "build_gold": gold.build_gold,
    "validate_gold": validate_gold,
    "version_gold": gold.version_gold,
    "materialize": materialize_date,
    "build_training_rows": lambda settings, day: build_feature_rows(settings, [day]),
    "features": features,
}


def step_of(table: dict[str, T], name: str, command: str) -> T:
    """The function behind `--step NAME` of `command`, or a ValueError listing the names."""
    if name not in table:
        raise ValueError(f"unknown {command} step {name!r}; steps: {', '.join(table)}")
    return table[name]


def cli_run_id() -> str:
    return f"cli-{uuid.uuid4().hex[:12]}"
