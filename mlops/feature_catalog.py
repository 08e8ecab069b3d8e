"""What `mlops features list` and `mlops features check` read: every declared feature
(pipelines/gold/contract.py FEATURES) with its declaration, the registered versions that take it, and how
fresh its Feast view's online rows are.

A version's inputs are its `lineage.model_inputs` tag (training writes it; training/tracking.py Lineage), read
for every version in one registry search, without loading a model. The versions in use are the champion and
the shadow the scoring service follows (the newest version above the champion: serving/models.py). A
feature in use by either must not leave the declarations: `removal_problems` names each input a version in
use takes that nothing declares any more (the service would refuse that champion at load, and the gate
could not compare with it), which `mlops features check` turns into a failing exit before a deploy.

A feature's lifecycle: add (declare it; the next features stage rebuilds the built dates, oldest first);
deprecate (name it in DEPRECATED: still built and served, no longer trained on, so the next promoted
version drops it); remove (delete the declaration once `deprecation_status` says no version in use takes
it; before that, `removal_problems` refuses the change with the versions named).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from model_contract.inputs import MODEL_INPUTS
from model_contract.onnx import CHAMPION_ALIAS, MODEL_NAME
from pipelines.gold.contract import FEATURES, Feature

if TYPE_CHECKING:
    from core.settings import Settings

INPUTS_TAG = "lineage.model_inputs"


@dataclass(frozen=True)
class Version:
    number: str
    inputs: tuple[str, ...] | None  # None: registered before its inputs were recorded
    role: str  # "champion", "shadow" or ""


@dataclass
class Entry:
    feature: Feature
    view: str
    used_by: list[Version] = field(default_factory=list)
    online_until: datetime | None = None  # the view's materialized rows reach this time

    def to_dict(self) -> dict:
        f = self.feature
        return {
            "name": f.name,
            "entity": f.entity,
            "input": f.input,
            "aggregation": f.aggregation,
            "window": f.window,
            "dtype": f.dtype,
            "description": f.description,
            "deprecated": f.deprecated or None,
            "view": self.view,
            "used_by": [{"version": v.number, "role": v.role} for v in self.used_by],
            "online_until": self.online_until.isoformat() if self.online_until else None,
        }


def registered_versions(tracking_uri: str) -> list[Version]:
    """Every version of the model with its recorded inputs and its role, newest first."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    missing = {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}
    found: list = []
    try:
        found = list(client.search_model_versions(f"name='{MODEL_NAME}'", max_results=1000))
    except MlflowException as exc:
        if exc.error_code not in missing:
            raise
    champion: str | None = None
    try:
        champion = str(client.get_model_version_by_alias(MODEL_NAME, CHAMPION_ALIAS).version)
    except MlflowException as exc:
        if exc.error_code not in missing:
            raise
    numbers = sorted((int(v.version) for v in found), reverse=True)
    shadow = next((str(n) for n in numbers if n > int(champion or 0)), None)
    out = []
    for version in sorted(found, key=lambda v: -int(v.version)):
        raw = (version.tags or {}).get(INPUTS_TAG)
        number = str(version.version)
        role = "champion" if number == champion else "shadow" if number == shadow else ""
        out.append(Version(number, tuple(json.loads(raw)) if raw else None, role))
    return out


def online_freshness(settings: Settings) -> dict[str, datetime | None]:
    """Each Feast view's most recent materialized end (None: never materialized, or no store)."""
    from features import repo
    from features.definitions import CUSTOMER_VIEW, MERCHANT_VIEW

    try:
        store = repo.open_store(settings)
        return {
            view: store.get_feature_view(view).most_recent_end_time for view in (CUSTOMER_VIEW, MERCHANT_VIEW)
        }
    except Exception:  # no registry applied yet: nothing is online
        return {CUSTOMER_VIEW: None, MERCHANT_VIEW: None}


def catalog(settings: Settings, versions: list[Version] | None = None) -> list[Entry]:
    """Every declared feature, in declared order, with the versions that take it and its view's freshness."""
    from features.definitions import CUSTOMER_VIEW, MERCHANT_VIEW

    versions = registered_versions(settings.mlflow_tracking_uri) if versions is None else versions
    fresh = online_freshness(settings)
    entries = []
    for feature in FEATURES:
        view = CUSTOMER_VIEW if feature.entity == "customer" else MERCHANT_VIEW
        users = [v for v in versions if v.inputs is not None and feature.name in v.inputs]
        entries.append(Entry(feature, view, users, fresh.get(view)))
    return entries


def removal_problems(versions: list[Version], built: tuple[str, ...] = MODEL_INPUTS) -> list[str]:
    """For each version in use (champion, shadow) that takes inputs nothing builds now, what it lacks."""
    problems = []
    for version in versions:
        if not version.role:
            continue
        if version.inputs is None:
            continue  # recorded before the tag: the service checks its ONNX file's names at load
        lacking = [name for name in version.inputs if name not in built]
        if lacking:
            problems.append(
                f"v{version.number} ({version.role}) takes {', '.join(lacking)}, which pipelines/gold/"
                "contract.py no longer declares: declare it again (deprecate it, do not remove it, while a "
                "served or shadowed version takes it), or promote a version that does not take it first"
            )
    return problems


def live_problems() -> list[str]:
    """The declarations the scoring service's live state cannot compute (features/live/values.py `Plan`):
    the service refuses to start with them, so they are refused here first, before a deploy."""
    from features.live import values

    return [plan.problem for plan in (values.CUSTOMER_PLAN, values.MERCHANT_PLAN) if plan.problem]


def deprecation_status(entries: list[Entry]) -> list[str]:
    """For each deprecated feature: the versions in use that still take it (keep the declaration), or that
    none does (its declaration can be removed)."""
    lines = []
    for entry in entries:
        f = entry.feature
        if not f.deprecated:
            continue
        in_use = [v for v in entry.used_by if v.role]
        if in_use:
            named = ", ".join(f"v{v.number} ({v.role})" for v in in_use)
            lines.append(
                f"{f.name} is deprecated ({f.deprecated}) and still taken by {named}: keep its declaration "
                "until a version trained without it is promoted and no shadow takes it"
            )
        else:
            lines.append(
                f"{f.name} is deprecated ({f.deprecated}) and no version in use takes it: its declaration "
                "can be removed (with its DEPRECATED entry)"
            )
    return lines
