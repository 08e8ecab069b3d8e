"""Retention of the model registry's artifacts, and the training sets a retention of datasets must keep.

A version's artifacts (the model files, its ONNX export, the evaluation plots, the model card) hold what it
learnt from its training data; the version's registry entry, its run's metrics and tags, and the promotion
history are the record of what was decided, and stay. `expire_model_artifacts` deletes the artifacts (the
run's and the logged model's) of every version that nothing may serve again, trained on data older than
`retention.model_days` before the newest arrival ingested (its `lineage.as_of`, not a clock), and tags the
version `retention.artifacts_deleted` with that date. Nothing may serve it again: no alias names it, and it
is not on the promotion history's champion stack (the champion the service serves and every one a rollback
could restore). `protected_training_sets` names the training sets of those same versions, which the
datasets' retention keeps (pipelines/retention.py): a version that may serve stays reproducible.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.settings import Settings
    from training.registry import ModelRegistry

log = logging.getLogger(__name__)

DELETED_TAG = "retention.artifacts_deleted"


def _registry(settings: Settings) -> ModelRegistry:
    from training.registry import ModelRegistry

    return ModelRegistry(settings.mlflow_tracking_uri)


def _versions(registry: ModelRegistry) -> list:
    from mlflow.exceptions import MlflowException

    try:
        return list(registry.client.search_model_versions(f"name = '{registry.name}'"))
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return []
        raise


def may_serve(settings: Settings, registry: ModelRegistry, versions: list) -> set[str]:
    """The versions that may be served again: named by an alias, or on the promotion history's champion
    stack (the champion and what rollbacks would restore)."""
    from model_contract.promotion_history import champion_stack
    from training.ledger import Ledger

    if not versions:
        return set()
    aliases = registry.client.get_registered_model(registry.name).aliases
    ledger = Ledger(settings.promotion_ledger_url)
    try:
        stack = champion_stack(ledger.history(registry.name))
    finally:
        ledger.dispose()
    return {str(v) for v in aliases.values()} | set(stack)


@dataclass(frozen=True)
class RegistryView:
    """The registry's versions and which of them may serve again, read once for a retention run (the
    registry searched and the promotion history read once, whatever asks)."""

    registry: ModelRegistry
    versions: list
    serving: set[str]

    @classmethod
    def read(cls, settings: Settings) -> RegistryView:
        registry = _registry(settings)
        versions = _versions(registry)
        return cls(registry, versions, may_serve(settings, registry, versions))


def protected_training_sets(settings: Settings, view: RegistryView | None = None) -> set[str]:
    """The training-set revisions of the versions that may serve again (`may_serve`)."""
    view = view or RegistryView.read(settings)
    versions, serving = view.versions, view.serving
    return {
        (v.tags or {})["lineage.training_set_rev"]
        for v in versions
        if str(v.version) in serving and (v.tags or {}).get("lineage.training_set_rev")
    }


def expire_model_artifacts(settings: Settings, newest: date, view: RegistryView | None = None) -> dict:
    """Delete the artifacts of the versions nothing may serve again whose training data is older than
    `retention.model_days` before `newest`; what was deleted, and what was kept though old and why."""
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    view = view or RegistryView.read(settings)
    registry, versions, serving = view.registry, view.versions, view.serving
    cutoff = newest - timedelta(days=settings.retention.model_days)
    report: dict = {"artifacts_removed": [], "kept": {}}
    for version in sorted(versions, key=lambda v: int(v.version)):
        number, tags = str(version.version), version.tags or {}
        as_of = tags.get("lineage.as_of")
        if DELETED_TAG in tags or not as_of or date.fromisoformat(as_of) >= cutoff:
            continue
        if number in serving:
            report["kept"][number] = "named by an alias or on the promotion history's champion stack"
            continue
        locations = [registry.client.get_run(version.run_id).info.artifact_uri]
        if getattr(version, "model_id", None):
            locations.append(registry.client.get_logged_model(version.model_id).artifact_location)
        for location in locations:
            get_artifact_repository(location, tracking_uri=registry.tracking_uri).delete_artifacts()
        registry.client.set_model_version_tag(registry.name, number, DELETED_TAG, newest.isoformat())
        report["artifacts_removed"].append(number)
    log.info("model retention: %s", report)
    return report


def models_retention(settings: Settings, newest: date | None) -> dict:
    """The models' part of a retention run, where MLflow and the promotion history can be read (the cluster's
    training image; `python -m training retention-models`): the training sets the datasets' retention must
    keep, then the expired artifacts (none before any arrival was ingested)."""
    view = RegistryView.read(settings)
    keep = protected_training_sets(settings, view)
    models: dict = {"artifacts_removed": [], "kept": {}}
    if newest:
        models = expire_model_artifacts(settings, newest, view)
    return {"protected_training_sets": sorted(keep), "models": models}
