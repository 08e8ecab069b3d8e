"""Feast's file registry, replaced atomically on every write.

Feast 0.67's FileRegistryStore truncates registry.db and writes the new bytes in place, so a process that
reads the registry meanwhile can find it empty or cut short ("feature service not found", or a protobuf
parse error). Here a writer and readers do overlap: the features DAG's materialize task records its
materialized interval while the retrain DAG, which starts as soon as gold is versioned, reads the feature
service for the training set's point-in-time join. This store writes a temporary file beside the registry
and renames it over the old one (os.replace: readers see the old bytes or the new, never a mix).

Configured by `registry_store_type` in features/feature_store.*.yaml; Feast imports it by that path.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

from feast.infra.registry.file import FileRegistryStore
from feast.protos.feast.core.Registry_pb2 import Registry as RegistryProto


class AtomicFileRegistryStore(FileRegistryStore):
    def _write_registry(self, registry_proto: RegistryProto) -> None:
        registry_proto.version_id = str(uuid.uuid4())
        registry_proto.last_updated.FromDatetime(datetime.now(UTC))
        self._filepath.parent.mkdir(parents=True, exist_ok=True)
        staged = self._filepath.with_name(f".{self._filepath.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        try:
            with open(staged, mode="wb", buffering=0) as out:
                out.write(registry_proto.SerializeToString())
                os.fsync(out.fileno())
            os.replace(staged, self._filepath)
        finally:
            staged.unlink(missing_ok=True)
