"""Batch writes into Feast's online store in Feast's own storage layout, without Feast's per-value work.

Feast 0.67's `online_write_batch` takes one protobuf `Value` per entity and feature, built by
`_convert_arrow_to_proto` through pandas and Python objects, and then, for SQLite, runs one `execute` per
entity and feature; for Redis it hashes every field name again for every entity. At 100k entities and
19 features that is 1.9M protobuf objects and 1.9M statements, most of a materialization's time.

The writers here produce the same bytes column by column:
  - a feature value is the serialized `Value` proto (`double_val`: tag 0x29 and 8 little-endian bytes;
    `int64_val`: tag 0x20 and a varint); a null or NaN is the empty `Value` (b""), as Feast writes it;
  - the entity key is Feast's `serialize_entity_key` (v3) of the single string join key, whose constant
    part is taken from Feast itself;
  - SQLite: Feast's table (`<project>_<view>`), Feast's upsert statement, `value_text` as Feast's
    `extract_text_and_num` gives it (`str` of the number) and timestamps through the `datetime` adapter
    Feast registers in sqlite3; one `executemany` and one transaction per batch, rows in key order
    (B-tree inserts stay local). The connection sets WAL and synchronous=NORMAL: the online store is a
    cache of gold that a rerun rebuilds, so the last transactions before a power loss may be redone;
  - Redis: Feast's key (entity key + project), fields (`_ts:<view>` and murmur3 of `<view>:<feature>`,
    hashed once per batch) and `Timestamp` proto; one HSET per entity, one pipeline per batch (the
    `skip_dedup: true` path of Feast, whose staleness check `features.materialize` does itself).

Every other configuration (other stores, other value types, vector or versioned tables) goes through
Feast's own `online_write_batch` (`FeastWriter`). tests/integration/test_online_store.py writes the same
rows both ways and compares the stored bytes.
"""

from __future__ import annotations

import sqlite3
import struct
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import TYPE_CHECKING, Protocol

from pipelines.gold.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    from feast import FeatureStore, FeatureView

_DOUBLE_TAG = 0x29  # Value.double_val: field 5, wire type 1 (fixed64)
_INT64_TAG = 0x20  # Value.int64_val: field 4, wire type 0 (varint)
_U32 = struct.Struct("<I")
# Entities whose values are encoded at once (Python objects: about 4 KiB per entity for SQLite).
ENCODE_ROWS = 10_000
READ_KEYS = 10_000  # entity keys per SQLite query of the reader
# SQLite page cache of the writing connection: the two indexes Feast keeps on its table stay in memory.
SQLITE_CACHE_KIB = 64 * 1024
# `OnlineReader.read(..., with_times=True)`: the key of a view's stored event times in the result.
TIMES_PREFIX = "__ts__"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class OnlineWriter(Protocol):
    def write(self, rows: pa.Table) -> None:
        """Write one row per entity: the join key, event and created time (timestamp[us, UTC], created
        never null) and the view's features."""

    def delete(self, keys: list[str]) -> None:
        """Remove the view's values of these entities (their gold rows were retracted)."""

    def close(self) -> None: ...


def open_writer(store: FeatureStore, view: FeatureView) -> OnlineWriter:
    """The fastest writer that reproduces Feast's layout for this store and view."""
    config = store.config
    online = config.online_store
    if (
        _plain_numeric_view(view)
        and config.entity_key_serialization_version >= 3
        and not config.registry.enable_online_feature_view_versioning
    ):
        if online.type == "sqlite" and not (
            online.vector_enabled or getattr(online, "enable_openai_compatible_store", False)
        ):
            return SqliteWriter(store, view)
        if online.type == "redis" and online.redis_type == "redis" and online.skip_dedup:
            return RedisWriter(store, view)
    return FeastWriter(store, view)


def _plain_numeric_view(view: FeatureView) -> bool:
    from feast.value_type import ValueType

    string_key = len(view.entity_columns) == 1 and view.entity_columns[0].dtype.to_value_type() is (
        ValueType.STRING
    )
    numeric = all(f.dtype.to_value_type() in (ValueType.INT64, ValueType.DOUBLE) for f in view.features)
    return string_key and numeric


class FeastWriter:
    """Feast's own conversion and `online_write_batch`: the reference the fast writers are tested
    against, and the path for configurations they do not cover."""

    def __init__(self, store: FeatureStore, view: FeatureView):
        self.store, self.view = store, view
        self.key = view.entity_columns[0].name

    def write(self, rows: pa.Table) -> None:
        from features.feast_private import arrow_to_proto, provider

        batch = rows.combine_chunks().to_batches()[0] if rows.num_rows else None
        if batch is None:
            return
        join_keys = {self.key: self.view.entity_columns[0].dtype.to_value_type()}
        data = arrow_to_proto(batch, self.view, join_keys)
        provider(self.store).online_write_batch(
            config=self.store.config, table=self.view, data=data, progress=None
        )

    def delete(self, keys: list[str]) -> None:
        from features.repo import FeatureStoreError

        online = self.store.config.online_store
        raise FeatureStoreError(
            f"online store {online.type!r} as configured here cannot remove the {len(keys)} entities of view "
            f"{self.view.name} whose gold rows were retracted (first: {', '.join(keys[:5])}); Feast has no "
            "call for it. Reload the online store from gold (feast teardown, apply, then materialize every "
            "date of the views' TTL) or use the SQLite or Redis store with the default settings."
        )

    def close(self) -> None:
        pass


def _entity_keys(rows: pa.Table, view: FeatureView, key_head: bytes) -> list[bytes]:
    return [key_head + _U32.pack(len(k)) + k for k in _utf8(rows[view.entity_columns[0].name])]


class _EncodedBatch:
    """Per feature, the serialized `Value` (and, for SQLite, Feast's `value_text`) of every row."""

    def __init__(self, view: FeatureView, rows: pa.Table, with_text: bool):
        from feast.value_type import ValueType

        self.names = [f.name for f in view.features]
        self.values: list[list[bytes]] = []
        self.texts: list[list[str | None]] = []
        for field in view.features:
            column = rows[field.name].combine_chunks()
            if field.dtype.to_value_type() is ValueType.INT64:
                encoded, valid, numbers = encode_int64(column)
            else:
                encoded, valid, numbers = encode_double(column)
            self.values.append(encoded)
            if with_text:
                self.texts.append(_texts(numbers, valid))


def _utf8(column: pa.ChunkedArray) -> list[bytes]:
    import pyarrow as pa

    return column.cast(pa.binary()).to_pylist()


def _texts(numbers: np.ndarray, valid: np.ndarray) -> list[str | None]:
    """Feast's `value_text`: `str` of the Python number, None for a null."""
    texts: list[str | None] = list(map(str, numbers.tolist()))
    if not valid.all():
        for i in (~valid).nonzero()[0].tolist():
            texts[i] = None
    return texts


def encode_double(column: pa.Array) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Serialized `Value(double_val=x)` per element, b"" for null and NaN (Feast writes an empty Value
    for what pandas calls null); also the validity mask and the numbers."""
    import numpy as np
    import pyarrow as pa

    numbers = np.ascontiguousarray(column.cast(pa.float64()).to_numpy(zero_copy_only=False), dtype="<f8")
    valid = ~np.isnan(numbers)
    out = np.empty((len(numbers), 9), np.uint8)
    out[:, 0] = _DOUBLE_TAG
    out[:, 1:] = numbers.view(np.uint8).reshape(-1, 8)
    return _binary(np.where(valid, 9, 0), out[valid]), valid, numbers


def encode_int64(column: pa.Array) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Serialized `Value(int64_val=x)` per element (varint of the two's complement), b"" for null."""
    import numpy as np
    import pyarrow as pa

    column = column.cast(pa.int64())
    valid = (
        column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else np.ones(len(column), bool)
    )
    numbers = np.ascontiguousarray(column.fill_null(0).to_numpy(), dtype="<i8")
    unsigned = numbers.view(np.uint64)
    digits = np.ones(len(numbers), np.int64)  # 7-bit groups of the varint, 1 to 10
    for group in range(1, 10):
        digits += (unsigned >> np.uint64(7 * group)) != 0
    out = np.empty((len(numbers), 11), np.uint8)
    out[:, 0] = _INT64_TAG
    for group in range(10):
        byte = ((unsigned >> np.uint64(7 * group)) & np.uint64(0x7F)).astype(np.uint8)
        out[:, 1 + group] = byte | np.where(group < digits - 1, 0x80, 0).astype(np.uint8)
    lengths = np.where(valid, digits + 1, 0)
    return _binary(lengths, out[np.arange(11)[None, :] < lengths[:, None]]), valid, numbers


def _binary(lengths: np.ndarray, data: np.ndarray) -> list[bytes]:
    """Python bytes objects cut from `data` (row-major) at `lengths`."""
    import numpy as np
    import pyarrow as pa

    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(np.ascontiguousarray(data))]
    return pa.Array.from_buffers(pa.large_binary(), len(lengths), buffers).to_pylist()


def _entity_key_head(view: FeatureView, version: int) -> bytes:
    """Feast's serialized entity key of the view's join key with an empty string value, less the value's
    4-byte length: every key of the view is this head, the value's length and its UTF-8 bytes."""
    from feast.infra.key_encoding_utils import serialize_entity_key
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    join_key = view.entity_columns[0].name
    empty = serialize_entity_key(
        EntityKey(join_keys=[join_key], entity_values=[Value(string_val="")]),
        entity_key_serialization_version=version,
    )
    probe = serialize_entity_key(
        EntityKey(join_keys=[join_key], entity_values=[Value(string_val="x")]),
        entity_key_serialization_version=version,
    )
    head = empty[:-4]
    if empty[-4:] != _U32.pack(0) or probe != head + _U32.pack(1) + b"x":
        raise RuntimeError(f"Feast's entity key layout (version {version}) is not head + length + bytes")
    return head


class SqliteWriter:
    def __init__(self, store: FeatureStore, view: FeatureView):
        from feast.infra.online_stores.helpers import compute_table_id

        from features.feast_private import sqlite_path

        config = store.config
        self.view = view
        self.key_head = _entity_key_head(view, config.entity_key_serialization_version)
        table = compute_table_id(config.project, view, False)
        quoted = '"' + table.replace('"', '""') + '"'
        # Feast's statement (SqliteOnlineStore.online_write_batch), same columns, same conflict rule.
        columns = ["entity_key", "feature_name", "value", "value_text", "event_ts", "created_ts"]
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])
        self.sql = (
            f"INSERT INTO {quoted} ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
            f"ON CONFLICT(entity_key, feature_name) DO UPDATE SET {updates};"
        )
        self.delete_sql = f"DELETE FROM {quoted} WHERE entity_key = ?"
        # The adapter sqlite3 applies to the datetimes Feast passes (Feast registers its own at import).
        self.adapt = sqlite3.adapters.get((datetime, sqlite3.PrepareProtocol), lambda value: value)
        self.conn = sqlite3.connect(sqlite_path(config), timeout=60)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(f"PRAGMA cache_size=-{SQLITE_CACHE_KIB}")

    def write(self, rows: pa.Table) -> None:
        """All rows in one transaction, in key order (each B-tree insert lands next to the previous one),
        encoded `ENCODE_ROWS` entities at a time while executemany consumes them."""
        import pyarrow as pa

        if not rows.num_rows:
            return
        keys = _entity_keys(rows, self.view, self.key_head)
        order = sorted(range(rows.num_rows), key=keys.__getitem__)
        keys = [keys[i] for i in order]
        rows = rows.take(pa.array(order, pa.int64()))

        def parameters():
            for offset in range(0, rows.num_rows, ENCODE_ROWS):
                yield self._parameters(rows.slice(offset, ENCODE_ROWS), keys[offset : offset + ENCODE_ROWS])

        with self.conn:
            self.conn.executemany(self.sql, chain.from_iterable(parameters()))

    def _parameters(self, rows: pa.Table, keys: list[bytes]):
        """One statement's parameters per entity and feature, entity after entity, as a zip of flat lists
        laid out by numpy (no Python code per row)."""
        import numpy as np
        import pyarrow as pa

        batch = _EncodedBatch(self.view, rows, with_text=True)
        per_entity = len(batch.names)
        naive = pa.timestamp("us")

        def repeated(values: list) -> list:
            return np.repeat(np.array(values, dtype=object), per_entity).tolist()

        def interleaved(columns: list[list]) -> list:
            cells = np.empty((rows.num_rows, per_entity), dtype=object)
            for j, column in enumerate(columns):
                cells[:, j] = column
            return cells.ravel().tolist()

        return zip(
            repeated(keys),
            batch.names * rows.num_rows,
            interleaved(batch.values),
            interleaved(batch.texts),
            repeated([self.adapt(t) for t in rows[EVENT_TIMESTAMP].cast(naive).to_pylist()]),
            repeated([self.adapt(t) for t in rows[CREATED_TIMESTAMP].cast(naive).to_pylist()]),
            strict=True,
        )

    def delete(self, keys: list[str]) -> None:
        head = self.key_head
        encoded = [head + _U32.pack(len(b)) + b for b in (k.encode("utf-8") for k in keys)]
        with self.conn:
            self.conn.executemany(self.delete_sql, ((k,) for k in encoded))

    def close(self) -> None:
        self.conn.close()


class RedisWriter:
    def __init__(self, store: FeatureStore, view: FeatureView):
        from features.feast_private import mmh3, redis_client

        config = store.config
        self.view = view
        self.key_head = _entity_key_head(view, config.entity_key_serialization_version)
        self.project = config.project.encode("utf-8")
        self.ts_field = f"_ts:{view.name}".encode()
        self.fields = [mmh3(f"{view.name}:{f.name}") for f in view.features]
        self.key_ttl = config.online_store.key_ttl_seconds
        # Feast's own client for this configuration (host, port, db, password, ssl of its connection string).
        self.client = redis_client(store)

    def write(self, rows: pa.Table) -> None:
        """One pipeline (one round trip) per `ENCODE_ROWS` entities."""
        from google.protobuf.timestamp_pb2 import Timestamp

        for offset in range(0, rows.num_rows, ENCODE_ROWS):
            part = rows.slice(offset, ENCODE_ROWS)
            batch = _EncodedBatch(self.view, part, with_text=False)
            keys = _entity_keys(part, self.view, self.key_head)
            micros = part[EVENT_TIMESTAMP].cast("int64").to_pylist()
            fields = self.fields
            with self.client.pipeline(transaction=False) as pipe:
                for key, us, values in zip(keys, micros, zip(*batch.values, strict=True), strict=True):
                    seconds, remainder = divmod(us, 1_000_000)
                    stamp = Timestamp(seconds=seconds, nanos=remainder * 1000).SerializeToString()
                    name = key + self.project
                    pairs = chain.from_iterable(zip(fields, values, strict=True))
                    pipe.execute_command("HSET", name, self.ts_field, stamp, *pairs)
                    if self.key_ttl:
                        pipe.expire(name, self.key_ttl)
                pipe.execute()

    def delete(self, keys: list[str]) -> None:
        """Feast keeps every view of an entity in one hash: only this view's fields are removed."""
        head = self.key_head
        with self.client.pipeline(transaction=False) as pipe:
            for raw in (k.encode("utf-8") for k in keys):
                pipe.hdel(head + _U32.pack(len(raw)) + raw + self.project, self.ts_field, *self.fields)
            pipe.execute()

    def close(self) -> None:
        pass


class OnlineReader:
    """Reads a feature service's values for entity rows straight from the layout the writers above
    produce (Feast's), returning what `FeatureStore.get_online_features(service, rows).to_dict()`
    returns: the rows' join keys as strings, then every feature of every view in the service's order,
    None where the store holds nothing. No registry lookup, request context or response proto per call:
    the views, table names, hash fields and key prefixes are resolved once, here.

    A `double_val` or `int64_val` in its canonical encoding (the only one Feast and these writers
    produce) is decoded directly; anything else goes through Feast's own proto conversion."""

    def __init__(self, store: FeatureStore, service) -> None:
        from feast.value_type import ValueType

        config = store.config
        self.store = store
        self.views = []
        for projection in service.feature_view_projections:
            view = store.get_feature_view(projection.name)
            names = [f.name for f in projection.features]
            integer = [f.dtype.to_value_type() is ValueType.INT64 for f in projection.features]
            head = _entity_key_head(view, config.entity_key_serialization_version)
            self.views.append((view, view.entity_columns[0].name, names, integer, head))
        self.join_keys = list(dict.fromkeys(join_key for _, join_key, *_ in self.views))

    @staticmethod
    def supports(store: FeatureStore, service) -> bool:
        config = store.config
        online = config.online_store
        layout = (online.type == "sqlite" and not online.vector_enabled) or (
            online.type == "redis" and online.redis_type == "redis"
        )
        return (
            layout
            and config.entity_key_serialization_version >= 3
            and not config.registry.enable_online_feature_view_versioning
            and all(
                _plain_numeric_view(store.get_feature_view(p.name)) and not p.name_alias
                for p in service.feature_view_projections
            )
        )

    def read(self, entity_rows: list[dict], with_times: bool = False) -> dict[str, list]:
        """Raises KeyError naming a join key that an entity row lacks.

        `with_times`: also, per view, `"__ts__<view name>"` (TIMES_PREFIX): the stored event time of each
        entity's row, a tz-aware UTC datetime, None where the store holds nothing; what Feast's
        `online_read` returns beside the values. Feast's online read does not apply the view's TTL, so a
        caller that must (the scoring service) needs these. Redis keeps microseconds; SQLite only whole
        seconds (Feast's sqlite3 adapter stores `int(datetime.timestamp())`), so a time read from SQLite
        can be up to a second earlier than the row's event time."""
        if not entity_rows:
            return {}
        missing = [k for k in self.join_keys if k not in entity_rows[0]]
        if missing:
            raise KeyError(f"entity rows lack the join keys {missing}; each row needs {self.join_keys}")
        try:
            # Feast converts entity values to its STRING type with str().
            result: dict[str, list] = {
                k: [str(row[k]) for row in entity_rows] for k in entity_rows[0] if k in self.join_keys
            }
        except KeyError as error:
            raise KeyError(
                f"an entity row lacks the join key {error}; each row needs {self.join_keys}"
            ) from None
        requests = [
            (
                view,
                names,
                [head + _U32.pack(len(b)) + b for b in (e.encode("utf-8") for e in result[join_key])],
            )
            for view, join_key, names, _, head in self.views
        ]
        fetched = self._fetch(requests, with_times)
        for (view, _, names, integer, _), (per_entity, times) in zip(self.views, fetched, strict=True):
            for j, (name, is_int) in enumerate(zip(names, integer, strict=True)):
                decode = _decode_int64 if is_int else _decode_double
                result[name] = [decode(values[j]) for values in per_entity]
            if times is not None:
                result[TIMES_PREFIX + view.name] = times
        return result

    def _fetch(
        self, requests, with_times: bool
    ) -> list[tuple[list[list[bytes | None]], list[datetime | None] | None]]:
        """Per request (view), each entity's stored values in the request's feature order, and, when
        `with_times`, each entity's stored event time (else None)."""
        raise NotImplementedError


_DOUBLE = struct.Struct("<d")


def _decode_double(raw: bytes | None):
    if raw is not None and len(raw) == 9 and raw[0] == _DOUBLE_TAG:
        return _DOUBLE.unpack_from(raw, 1)[0]
    return _decode_value(raw)


def _decode_int64(raw: bytes | None):
    if raw is not None and len(raw) == 2 and raw[0] == _INT64_TAG and raw[1] < 0x80:
        return raw[1]
    return _decode_value(raw)


def _decode_value(raw: bytes | None):
    from feast.protos.feast.types.Value_pb2 import Value
    from feast.type_map import feast_value_type_to_python_type

    if not raw:
        return None
    return feast_value_type_to_python_type(Value.FromString(raw))


class SqliteReader(OnlineReader):
    def __init__(self, store: FeatureStore, service) -> None:
        from feast.infra.online_stores.helpers import compute_table_id

        from features.feast_private import sqlite_path

        super().__init__(store, service)
        path = sqlite_path(store.config)
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.tables = {
            view.name: '"' + compute_table_id(store.config.project, view, False).replace('"', '""') + '"'
            for view, *_ in self.views
        }

    def _fetch(self, requests, with_times: bool):
        out: list[tuple[list[list[bytes | None]], list[datetime | None] | None]] = []
        columns = (
            "entity_key, feature_name, value, event_ts" if with_times else "entity_key, feature_name, value"
        )
        for view, names, keys in requests:
            unique = list(dict.fromkeys(keys))
            found: dict[bytes, dict[str, bytes]] = {}
            stamps: dict[bytes, object] = {}
            for offset in range(0, len(unique), READ_KEYS):  # SQLite binds at most 32,766 parameters
                part = unique[offset : offset + READ_KEYS]
                sql = (
                    f"SELECT {columns} FROM {self.tables[view.name]} "
                    f"WHERE entity_key IN ({','.join('?' * len(part))})"
                )
                rows = self.conn.execute(sql, part)
                if with_times:
                    for key, name, value, stamp in rows:
                        found.setdefault(key, {})[name] = value
                        stamps[key] = stamp  # an entity's feature rows carry one time (one write)
                else:
                    for key, name, value in rows:
                        found.setdefault(key, {})[name] = value
            empty: dict[str, bytes] = {}
            values = [[found.get(k, empty).get(n) for n in names] for k in keys]
            times = [_sqlite_time(stamps.get(k)) for k in keys] if with_times else None
            out.append((values, times))
        return out


def _sqlite_time(stored: object) -> datetime | None:
    """The event time Feast's SQLite store returns for a stored `event_ts`: its adapter writes
    `int(naive_utc.timestamp())` (whole seconds, the naive time read as local), and its reader turns the
    value back with `datetime.fromtimestamp` (local) and labels it UTC; the same here. ISO text (what
    sqlite3's own adapter writes where Feast's is not registered) is read as UTC when it has no offset."""
    if stored is None:
        return None
    if isinstance(stored, int | float):
        return datetime.fromtimestamp(int(stored)).replace(tzinfo=UTC)
    text = stored.decode() if isinstance(stored, bytes) else str(stored)
    parsed = datetime.fromisoformat(text)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


class RedisReader(OnlineReader):
    def __init__(self, store: FeatureStore, service) -> None:
        from features.feast_private import mmh3, redis_client

        super().__init__(store, service)
        self.project = store.config.project.encode("utf-8")
        self.fields = {
            view.name: [mmh3(f"{view.name}:{name}") for name in names] for view, _, names, *_ in self.views
        }
        self.ts_fields = {view.name: f"_ts:{view.name}".encode() for view, *_ in self.views}
        self.client = redis_client(store)

    def _fetch(self, requests, with_times: bool):
        with self.client.pipeline(transaction=False) as pipe:
            for view, _, keys in requests:
                fields = self.fields[view.name]
                if with_times:
                    fields = [*fields, self.ts_fields[view.name]]
                for key in keys:
                    pipe.execute_command("HMGET", key + self.project, *fields)
            replies = pipe.execute()
        out: list[tuple[list[list[bytes | None]], list[datetime | None] | None]] = []
        offset = 0
        for _, _, keys in requests:
            part = replies[offset : offset + len(keys)]
            offset += len(keys)
            if with_times:
                out.append(([reply[:-1] for reply in part], [_redis_time(reply[-1]) for reply in part]))
            else:
                out.append((part, None))
        return out


def _redis_time(stored: bytes | None) -> datetime | None:
    """A view's `_ts:<view>` field: a serialized protobuf `Timestamp` (RedisWriter, Feast's
    online_write_batch), exact to the microsecond (Feast's own reader goes through a float)."""
    if not stored:
        return None
    from google.protobuf.timestamp_pb2 import Timestamp

    stamp = Timestamp.FromString(stored)
    return _EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)


def open_reader(store: FeatureStore, service) -> OnlineReader | None:
    """A direct reader of the service for this store, or None where Feast's own path must serve."""
    if not OnlineReader.supports(store, service):
        return None
    return (
        SqliteReader(store, service)
        if store.config.online_store.type == "sqlite"
        else RedisReader(store, service)
    )
