"""Online reads of the fraud_model_v1 features, for a scoring process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.settings import Settings
from features.definitions import FEATURE_SERVICE
from features.repo import DEFAULT_PROJECT, FeatureStoreError, open_store

if TYPE_CHECKING:
    from feast import FeatureStore


class OnlineFeatures:
    """The fraud_model_v1 features of entity rows, for a scoring process: open once, call per request.

    The feature service is resolved once, here (Feast 0.67 rebuilds it from the registry proto on every
    `get_feature_service`, most of a read's time), and reads go straight to the online store's tables or
    hashes through `features.online_store.OnlineReader`, which returns what Feast's
    `get_online_features(...).to_dict()` returns (tests compare both on sampled entities) without Feast's
    per-call request context and response protos. `feast_get` is Feast's own call with the same resolved
    service. A store whose layout the reader does not know is served by Feast's call.

    The service is not re-read: a process that must see a changed feature service opens a new one."""

    def __init__(self, store: FeatureStore) -> None:
        from features.online_store import open_reader

        self.store = store
        self.service = store.get_feature_service(FEATURE_SERVICE)
        self._reader = open_reader(store, self.service)

    def get(self, entity_rows: list[dict[str, Any]]) -> dict[str, list]:
        if self._reader is None:
            return self.feast_get(entity_rows)
        try:
            return self._reader.read(entity_rows)
        except KeyError as error:
            raise FeatureStoreError(str(error.args[0])) from None

    def feast_get(self, entity_rows: list[dict[str, Any]]) -> dict[str, list]:
        return self.store.get_online_features(features=self.service, entity_rows=entity_rows).to_dict()


def open_online(settings: Settings, project: str = DEFAULT_PROJECT) -> OnlineFeatures:
    return OnlineFeatures(open_store(settings, project))


def online_features(
    settings: Settings,
    entity_rows: list[dict[str, Any]],
    project: str = DEFAULT_PROJECT,
    store: FeatureStore | None = None,
) -> dict[str, list]:
    """The fraud_model_v1 features for each entity row ({"customer_id": ..., "merchant_id": ...}), for
    one call; a process serving many requests keeps an `open_online(settings)` instead."""
    return OnlineFeatures(store or open_store(settings, project)).get(entity_rows)
