"""Every private Feast API this project calls, in one place, each with why. Feast is pinned below its next
minor (pyproject.toml) and the contract tests (tests/integration/test_feast_contract.py and
test_online_store.py) run Feast's public calls on the same data as the paths that use these, so an
upgrade that moves one of them fails a test here instead of corrupting a store.

Public but deep paths (`feast.infra...`, `feast.protos...`) are imported where they are used; only names
with a leading underscore, which Feast may change in any release, are wrapped here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from feast import FeatureStore
    from feast.repo_config import RepoConfig


def apply_diffs(store: FeatureStore, registry_diff: Any, infra_diff: Any, new_infra: Any) -> None:
    """`FeatureStore._apply_diffs`: what `feast apply` calls after its plan. The public `apply` takes
    objects, not a plan, so it cannot skip the write when the plan holds only Feast's spurious `meta`
    updates (features/repo.py `_is_real_change`)."""
    store._apply_diffs(registry_diff, infra_diff, new_infra)


def provider(store: FeatureStore) -> Any:
    """`FeatureStore._get_provider()`: the provider's `online_read` / `online_write_batch` take Arrow rows
    and entity keys directly, without the per-request context of `get_online_features`."""
    return store._get_provider()


def redis_client(store: FeatureStore) -> Any:
    """`RedisOnlineStore._get_client`: the store's own client (same connection settings, cluster or not)
    for the pipelined writer and reader of features/online_store.py."""
    return provider(store).online_store._get_client(store.config.online_store)


def sqlite_path(config: RepoConfig) -> str:
    """`SqliteOnlineStore._get_db_path`: where the SQLite online store's file is, resolved as Feast does
    (relative to the repo path)."""
    from feast.infra.online_stores.sqlite import SqliteOnlineStore

    return SqliteOnlineStore._get_db_path(config)


def arrow_to_proto(table: Any, view: Any, join_keys: dict) -> Any:
    """`feast.utils._convert_arrow_to_proto`: the conversion Feast's own materialization uses before
    `online_write_batch` (the fallback writer uses it, so its bytes are Feast's by construction)."""
    from feast.utils import _convert_arrow_to_proto

    return _convert_arrow_to_proto(table, view, join_keys)


def mmh3(key: str) -> bytes:
    """`feast.infra.online_stores.helpers._mmh3`: the hash of a feature name that Redis hash fields use."""
    from feast.infra.online_stores.helpers import _mmh3

    return _mmh3(key)
