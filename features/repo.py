"""The Feast repo's store: configuration per profile, opening the store, `apply` and teardown.

The profile in the settings picks the configuration (`feature_store.<profile>.yaml`, filled from the
settings); the same functions run against SQLite (local) and Redis (cluster). Feast is imported inside the
functions (see features/definitions.py for why). Materialization, online reads and the point-in-time join
are in materialize.py, online.py and offline.py beside this module.

The yaml templates and the `feast` CLI's folder (feast_repo/) are package data of `features`, found with
`importlib.resources`, so an installed wheel finds them as a checkout does.
"""

from __future__ import annotations

import importlib.resources
import string
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from core.errors import PipelineError
from core.settings import Profile, Settings
from features.definitions import FraudFeatureDefinitions, build_definitions

if TYPE_CHECKING:
    from feast import FeatureStore

DEFAULT_PROJECT = "fraud"


class FeatureStoreError(PipelineError):
    """A feature store operation that cannot go on; the message says what to do."""


class GoldTableMissingError(FeatureStoreError, FileNotFoundError):
    pass


@dataclass(frozen=True)
class ApplyResult:
    changed: list[str]  # "<transition> <type> <name>" for every object created, updated or deleted

    @property
    def changed_anything(self) -> bool:
        return bool(self.changed)


def config_template(profile: Profile) -> Traversable:
    """The profile's feature_store.yaml template (features/feature_store.<profile>.yaml)."""
    return importlib.resources.files("features") / f"feature_store.{profile.value}.yaml"


def cli_repo_dir() -> Path:
    """The folder to give the `feast` CLI as its repository (`feast -c`): features/feast_repo/. The CLI
    imports the .py files in it, so it must be a real folder, as it is in a checkout and once the wheel is
    installed."""
    folder = importlib.resources.files("features") / "feast_repo"
    if not isinstance(folder, Path) or not folder.is_dir():
        raise FeatureStoreError(
            f"the feast CLI's repository {folder} is not a folder on disk (features is imported from an "
            "archive?): install the package from its wheel into a folder to use the feast CLI"
        )
    return folder


def redis_connection_string(url: str) -> str:
    """Feast's Redis form (`host:port,db=N,password=...,ssl=true`) of a `redis://` or `rediss://` URL."""
    parsed = urlparse(url)
    if parsed.scheme not in ("redis", "rediss") or not parsed.hostname:
        raise FeatureStoreError(
            f"MLOPS_CLUSTER__REDIS_URL={url!r} is not a redis:// or rediss:// URL with a host; "
            "set it like redis://127.0.0.1:6379/0"
        )
    parts = [f"{parsed.hostname}:{parsed.port or 6379}"]
    database = parsed.path.lstrip("/")
    if database:
        if not database.isdigit():
            raise FeatureStoreError(
                f"MLOPS_CLUSTER__REDIS_URL={url!r}: database {database!r} is not a number"
            )
        parts.append(f"db={database}")
    if parsed.password:
        parts.append(f"password={unquote(parsed.password)}")
    if parsed.scheme == "rediss":
        parts.append("ssl=true")
    return ",".join(parts)


def render_config(settings: Settings, project: str = DEFAULT_PROJECT) -> str:
    """The profile's feature_store.yaml with its placeholders filled from the settings."""
    values = {"FEAST_PROJECT": project, "FEAST_DIR": str(settings.feast_dir)}
    if settings.profile is Profile.CLUSTER:
        values["REDIS_CONNECTION_STRING"] = redis_connection_string(settings.cluster.redis_url)
    return string.Template(config_template(settings.profile).read_text(encoding="utf-8")).substitute(values)


def open_store(settings: Settings, project: str = DEFAULT_PROJECT) -> FeatureStore:
    """A FeatureStore for the active profile. Writes the rendered configuration to
    `$MLOPS_HOME/feast/feature_store.yaml` so that the `feast` CLI sees the same store."""
    import yaml
    from feast import FeatureStore, RepoConfig

    rendered = render_config(settings, project)
    settings.feast_dir.mkdir(parents=True, exist_ok=True)
    cli_config = settings.feast_dir / "feature_store.yaml"
    if not cli_config.exists() or cli_config.read_text() != rendered:
        cli_config.write_text(rendered)
    config = RepoConfig(**yaml.safe_load(rendered))
    config.repo_path = settings.feast_dir
    return FeatureStore(config=config)


def definitions(settings: Settings) -> FraudFeatureDefinitions:
    return build_definitions(settings.lake)


def apply(settings: Settings, project: str = DEFAULT_PROJECT) -> ApplyResult:
    """Register the definitions and create the online tables. Idempotent: Feast's own plan (the diff that
    `feast plan` prints) is computed first and nothing is written when it is empty."""
    from feast import Project
    from feast.diff.property_diff import TransitionType
    from feast.feature_view import DUMMY_ENTITY
    from feast.repo_contents import RepoContents

    from features.feast_private import apply_diffs

    store = open_store(settings, project)
    repo = definitions(settings)
    desired = RepoContents(
        projects=[Project(name=project, description=store.config.project_description or "")],
        data_sources=[repo.customer_source, repo.merchant_source],
        feature_views=repo.feature_views,
        on_demand_feature_views=[],
        stream_feature_views=[],
        label_views=[],
        entities=[repo.customer, repo.merchant, DUMMY_ENTITY],
        feature_services=[repo.fraud_model_v1],
        permissions=[],
    )
    registry_diff, infra_diff, new_infra = store.plan(desired)
    changed = [
        f"{d.transition_type.name.lower()} {d.feast_object_type.value} {d.name}"
        for d in registry_diff.feast_object_diffs
        if _is_real_change(d)
    ]
    infra_changed = [
        f"{d.transition_type.name.lower()} {d.infra_object_type} {d.name}"
        for d in infra_diff.infra_object_diffs
        if d.transition_type is not TransitionType.UNCHANGED
    ]
    if changed or infra_changed:
        # The same call `feast apply` makes after its plan: registry first, then the online tables.
        apply_diffs(store, registry_diff, infra_diff, new_infra)
    return ApplyResult(changed=changed + infra_changed)


def _is_real_change(diff) -> bool:
    """Feast 0.67 compares a feature view's embedded source including its `meta` (creation and update
    times, stamped anew whenever the definitions are built in a new process), so every apply from a fresh
    process reports the views as updated and rewrites the registry (`feast apply` run twice shows it).
    A change that is only that is not a change."""
    from feast.diff.property_diff import TransitionType

    if diff.transition_type is TransitionType.UNCHANGED:
        return False
    if diff.transition_type is not TransitionType.UPDATE:
        return True
    for prop in diff.feast_object_property_diffs:
        if prop.property_name in ("batch_source", "stream_source"):
            existing, declared = type(prop.val_existing)(), type(prop.val_declared)()
            existing.CopyFrom(prop.val_existing)
            declared.CopyFrom(prop.val_declared)
            existing.ClearField("meta")
            declared.ClearField("meta")
            if existing == declared:
                continue
        return True
    return False


def teardown(settings: Settings, project: str = DEFAULT_PROJECT) -> None:
    """Remove the project's online tables or keys and its registry."""
    store = open_store(settings, project)
    store.teardown()
