"""The feature store behind a small interface: open, apply, materialize, read online, read historical.

The profile in the settings picks the configuration (`feature_store.<profile>.yaml`, filled from the
settings); the same functions run against SQLite (local) and Redis (cluster). Feast is imported inside the
functions (see features/definitions.py for why).

Materialization does not use Feast's engine: the local engine reads the whole window into one Arrow table
before writing (`retrieval_job.to_arrow()`), so memory grows with the window. Here a window is streamed
from the gold Parquet by Acero plans: the first pass keeps, per entity, only the key and timestamps of its
latest row (event time, then created time: two hash aggregations over three columns); the second streams
every column through a semi join with that table (its hash table built once) and writes the rows that are
some entity's latest in Feast's online layout, `WRITE_ROWS` entities per transaction or pipelines of
`ENCODE_ROWS` (features/online_store.py: the bytes Feast's `online_write_batch` would store, without its
per-value protobuf objects and statements). Memory is bounded by the number of entities in the window
plus one batch, not by the number of rows.
"""

from __future__ import annotations

import string
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from features.definitions import (
    CUSTOMER_JOIN_KEY,
    FEATURE_SERVICE,
    INTEGER_FEATURES,
    MERCHANT_JOIN_KEY,
    FraudFeatureDefinitions,
    build_definitions,
)
from features.online_store import open_writer
from mlops.settings import Profile, Settings
from pipelines.errors import PipelineError
from pipelines.features.contract import (
    CREATED_TIMESTAMP,
    CUSTOMER_TABLE,
    EVENT_TIMESTAMP,
    MERCHANT_TABLE,
    PARTITION_COLUMN,
    table_path,
)

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from feast import FeatureStore, FeatureView

HERE = Path(__file__).resolve().parent
DEFAULT_PROJECT = "fraud"
# The step that writes gold, named in errors when a gold table is missing.
GOLD_COMMAND = "mlops features --date YYYY-MM-DD --step build_gold"
SCAN_ROWS = 250_000  # rows per Parquet batch
GUARD_ROWS = 10_000  # entities per read of stored event times (re-materializing an older window)
# Entities per write: one SQLite transaction in key order. Each transaction sweeps the B-trees once, so
# fewer, larger ones pay at 1M entities (10M gold rows: 189 s at 100k, 138 s at 500k); the Python objects
# of a write are bounded separately (features.online_store.ENCODE_ROWS).
WRITE_ROWS = 500_000
_TABLE_OF_VIEW = {"customer_stats_fv": CUSTOMER_TABLE, "merchant_stats_fv": MERCHANT_TABLE}
_KEY_OF_VIEW = {"customer_stats_fv": CUSTOMER_JOIN_KEY, "merchant_stats_fv": MERCHANT_JOIN_KEY}


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


@dataclass(frozen=True)
class ViewMaterialization:
    feature_view: str
    start: datetime
    end: datetime
    rows_scanned: int  # gold rows in [start, end)
    entities: int  # distinct entities in the window
    rows_written: int  # rows written to the online store (one per entity, fewer when guarded)
    rows_kept_newer: int  # entities whose online value is newer than this window's (left as they are)
    seconds: float


def config_template(profile: Profile) -> Path:
    return HERE / f"feature_store.{profile.value}.yaml"


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
    return string.Template(config_template(settings.profile).read_text()).substitute(values)


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
        store._apply_diffs(registry_diff, infra_diff, new_infra)
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


def _gold_dataset(lake: Path, table: str):
    import pyarrow as pa
    import pyarrow.dataset as ds

    path = table_path(lake, table)
    if not path.is_dir() or not any(path.glob(f"{PARTITION_COLUMN}=*/*.parquet")):
        raise GoldTableMissingError(
            f"gold table {table!r} has no partitions at {path} "
            f"(expected {PARTITION_COLUMN}=YYYY-MM-DD/*.parquet); write gold first: {GOLD_COMMAND}"
        )
    partitioning = ds.partitioning(pa.schema([(PARTITION_COLUMN, pa.string())]), flavor="hive")
    return ds.dataset(path, format="parquet", partitioning=partitioning)


def _window_filter(start: datetime, end: datetime):
    """Rows with start <= event_timestamp < end (Feast's convention), pruned to the partitions that can
    hold them: event_date is the UTC date of event_timestamp (gold contract)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    last_day = datetime.fromtimestamp(end.timestamp() - 1e-6, tz=UTC).date()
    ts = pa.timestamp("us", tz="UTC")
    return (
        (ds.field(PARTITION_COLUMN) >= start.date().isoformat())
        & (ds.field(PARTITION_COLUMN) <= last_day.isoformat())
        & (ds.field(EVENT_TIMESTAMP) >= pa.scalar(start, type=ts))
        & (ds.field(EVENT_TIMESTAMP) < pa.scalar(end, type=ts))
    )


def _normalise_timestamps(table: pa.Table) -> pa.Table:
    """Both timestamps as microseconds in UTC, created time never null (a null ranks oldest)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ts = pa.timestamp("us", tz="UTC")
    for column in (EVENT_TIMESTAMP, CREATED_TIMESTAMP):
        index = table.schema.get_field_index(column)
        values = table[column].cast(ts)
        if column == CREATED_TIMESTAMP:
            values = pc.fill_null(values, pa.scalar(0, type=ts))
        table = table.set_column(index, column, values)
    return table


def _window_rows(dataset, columns: list[str], window, batch_rows: int):
    """An Acero source of the window's rows (`columns`, timestamps normalised as _normalise_timestamps
    does). Read-ahead is kept small: each batch in flight is memory. Pre-buffering (Arrow's default)
    reads a whole row group's column chunks ahead, which pays on object storage; gold is on a local disk,
    where it only doubles the memory of a scan (241 vs 138 MiB peak over 1M rows of 25 columns)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from pyarrow import acero

    ts = pa.timestamp("us", tz="UTC")
    projected = [pc.field(name) for name in columns]
    projected[columns.index(EVENT_TIMESTAMP)] = pc.field(EVENT_TIMESTAMP).cast(ts)
    projected[columns.index(CREATED_TIMESTAMP)] = pc.coalesce(
        pc.field(CREATED_TIMESTAMP).cast(ts), pa.scalar(0, type=ts)
    )
    scan = acero.Declaration(
        "scan",
        acero.ScanNodeOptions(
            dataset,
            columns=columns,
            filter=window,
            batch_size=batch_rows,
            batch_readahead=1,
            fragment_readahead=1,
            fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=False),
        ),
    )
    # The scan node only prunes with the filter; the filter node applies it row by row.
    rows = acero.Declaration("filter", acero.FilterNodeOptions(window), inputs=[scan])
    return acero.Declaration("project", acero.ProjectNodeOptions(projected, columns), inputs=[rows])


def _semi_join(rows, table: pa.Table, keys: list[str]):
    """`rows` (an Acero source) that match a row of `table` on `keys`. The hash table of `table` is
    built once and the scan streams through it."""
    from pyarrow import acero

    return acero.Declaration(
        "hashjoin",
        acero.HashJoinNodeOptions("left semi", keys, keys),
        inputs=[rows, acero.Declaration("table_source", acero.TableSourceNodeOptions(table))],
    )


def _aggregate(rows, keys: list[str], aggregates: list[tuple]) -> pa.Table:
    """Hash aggregation of an Acero source: `aggregates` are (column, function, options, name)."""
    from pyarrow import acero

    out = acero.Declaration("aggregate", acero.AggregateNodeOptions(aggregates, keys=keys), inputs=[rows])
    return out.to_table(use_threads=True).select([*keys, *(a[-1] for a in aggregates)])


def _window_winners(dataset, key: str, window, batch_rows: int) -> tuple[pa.Table, int]:
    """Pass 1: per entity, the event and created time of its latest row in the window (event time first,
    created time breaking ties, as Feast's point-in-time join does), and the rows scanned. Two streaming
    Acero plans over the key and both times: the latest event time per entity (a hash aggregation), then
    the latest created time among the rows at that event time (a semi join with the first, built once,
    and a second aggregation). Memory is the per-entity tables, not the window."""
    import pyarrow.compute as pc

    columns = [key, EVENT_TIMESTAMP, CREATED_TIMESTAMP]
    latest_event = _aggregate(
        _window_rows(dataset, columns, window, batch_rows),
        [key],
        [
            (EVENT_TIMESTAMP, "hash_max", None, EVENT_TIMESTAMP),
            (key, "hash_count", pc.CountOptions(mode="all"), "rows"),
        ],
    )
    scanned = pc.sum(latest_event["rows"]).as_py() or 0
    at_latest = _semi_join(
        _window_rows(dataset, columns, window, batch_rows), latest_event.select(columns[:2]), columns[:2]
    )
    winners = _aggregate(at_latest, columns[:2], [(CREATED_TIMESTAMP, "hash_max", None, CREATED_TIMESTAMP)])
    return winners.combine_chunks(), scanned


def _latest_rows(dataset, columns: list[str], window, winners: pa.Table, batch_rows: int):
    """Pass 2: the window's rows that are some entity's latest (a semi join on key, event and created
    time with the winners of pass 1), as a stream of record batches in no particular order. One plan,
    the winners' hash table built once (a join per scanned batch rebuilt it for every batch: over 10M
    gold rows, 1.3 GiB and 8.6 s instead of 0.26 GiB and 2.2 s)."""
    plan = _semi_join(_window_rows(dataset, columns, window, batch_rows), winners, columns[:3])
    for batch in plan.to_reader(use_threads=True):
        if batch.num_rows:
            yield batch


def _entity_keys(view: FeatureView, keys: list[str]):
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    join_key = view.entity_columns[0].name
    return [EntityKey(join_keys=[join_key], entity_values=[Value(string_val=k)]) for k in keys]


def _drop_stale(store: FeatureStore, view: FeatureView, rows: pa.Table, key: str) -> pa.Table:
    """Rows whose entity holds a value from a later event in the online store are left out, so that
    re-materializing an older window (late data) never moves an entity back in time. The stored times
    are read `GUARD_ROWS` entities at a time (Feast's SQLite read binds one parameter per entity, and
    SQLite takes at most 32,766)."""
    import pyarrow as pa

    provider = store._get_provider()
    keep: list[bool] = []
    for offset in range(0, rows.num_rows, GUARD_ROWS):
        part = rows.slice(offset, GUARD_ROWS)
        stored = provider.online_read(
            config=store.config,
            table=view,
            entity_keys=_entity_keys(view, part[key].to_pylist()),
            requested_features=[view.features[0].name],
        )
        keep += [
            stored_ts is None or stored_ts.replace(tzinfo=stored_ts.tzinfo or UTC) <= new_ts
            for (stored_ts, _), new_ts in zip(stored, part[EVENT_TIMESTAMP].to_pylist(), strict=True)
        ]
    return rows.filter(pa.array(keep, type=pa.bool_()))


def _materialize_view(
    store: FeatureStore,
    view: FeatureView,
    lake: Path,
    start: datetime,
    end: datetime,
    scan_rows: int,
    write_rows: int,
) -> ViewMaterialization:
    import pyarrow as pa
    import pyarrow.compute as pc

    started = time.perf_counter()
    key = _KEY_OF_VIEW[view.name]
    dataset = _gold_dataset(lake, _TABLE_OF_VIEW[view.name])
    window = _window_filter(start, end)
    winners, scanned = _window_winners(dataset, key, window, scan_rows)
    # A later window already materialized may hold newer values for some of these entities.
    guard = any(interval[1] > end for interval in _materialized_intervals(view))
    columns = [key, EVENT_TIMESTAMP, CREATED_TIMESTAMP, *(f.name for f in view.features)]
    writer = open_writer(store, view)
    written = kept_newer = 0
    pending: list[pa.RecordBatch] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal written, kept_newer, pending, pending_rows
        rows = pa.Table.from_batches(pending).combine_chunks()
        pending, pending_rows = [], 0
        # Two gold rows of one entity at the same latest event and created time (two transactions of a
        # customer in the same millisecond) both match: keep one, as Feast's own join keeps one of such
        # ties. Columns are picked by name: Arrow's output order of keys and aggregates (keys first since
        # pyarrow 25, last before) is not something to rely on.
        if pc.count_distinct(rows[key]).as_py() < rows.num_rows:
            grouped = rows.group_by(key, use_threads=False).aggregate(
                [(name, "first") for name in columns if name != key]
            )
            rows = pa.table({name: grouped[name if name == key else f"{name}_first"] for name in columns})
        if guard:
            fresh = _drop_stale(store, view, rows, key)
            kept_newer += rows.num_rows - fresh.num_rows
            rows = fresh
        for offset in range(0, rows.num_rows, write_rows):
            writer.write(rows.slice(offset, write_rows))
        written += rows.num_rows

    try:
        if winners.num_rows:
            for latest in _latest_rows(dataset, columns, window, winners, scan_rows):
                pending.append(latest)
                pending_rows += latest.num_rows
                if pending_rows >= write_rows:
                    flush()
            if pending_rows:
                flush()
    finally:
        writer.close()
    store.registry.apply_materialization(view, store.project, start, end, commit=True)
    return ViewMaterialization(
        feature_view=view.name,
        start=start,
        end=end,
        rows_scanned=scanned,
        entities=winners.num_rows,
        rows_written=written,
        rows_kept_newer=kept_newer,
        seconds=time.perf_counter() - started,
    )


def _materialized_intervals(view: FeatureView) -> list[tuple[datetime, datetime]]:
    return [
        (s.replace(tzinfo=s.tzinfo or UTC), e.replace(tzinfo=e.tzinfo or UTC))
        for s, e in view.materialization_intervals
    ]


def _check_window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    if start.tzinfo is None or end.tzinfo is None:
        raise FeatureStoreError(
            f"materialize needs timezone-aware bounds (got start={start!r}, end={end!r}); "
            "pass the data interval Airflow gives, which is in UTC"
        )
    if start >= end:
        raise FeatureStoreError(f"materialize window is empty: start {start} is not before end {end}")
    return start.astimezone(UTC), end.astimezone(UTC)


def materialize(
    settings: Settings,
    start: datetime,
    end: datetime,
    project: str = DEFAULT_PROJECT,
    views: list[str] | None = None,
    scan_rows: int = SCAN_ROWS,
    write_rows: int = WRITE_ROWS,
) -> list[ViewMaterialization]:
    """Load the gold rows with start <= event_timestamp < end into the online store: per entity, its
    latest row in the window, unless the store already holds a later event for it. Rerunning a window
    after gold was rewritten (late data) writes the rewritten rows. Needs `apply` first."""
    start, end = _check_window(start, end)
    store = open_store(settings, project)
    registered = {v.name: v for v in store.list_feature_views()}
    wanted = views or list(_TABLE_OF_VIEW)
    missing = [name for name in wanted if name not in registered]
    if missing:
        raise FeatureStoreError(
            f"feature views {missing} are not registered in project {project!r} "
            f"(registry {settings.feast_dir / 'registry.db'}); run features.store.apply first"
        )
    return [
        _materialize_view(store, registered[name], settings.lake, start, end, scan_rows, write_rows)
        for name in wanted
    ]


class OnlineFeatures:
    """The fraud_model_v1 features of entity rows, for a scoring process: open once, call per request.

    The feature service is resolved once, here (Feast 0.67 rebuilds it from the registry proto on every
    `get_feature_service`, 2-5 ms), and reads go straight to the online store's tables or hashes through
    `features.online_store.OnlineReader`, which returns what Feast's `get_online_features(...).to_dict()`
    returns (tests compare both on sampled entities) without Feast's per-call request context and
    response protos. `feast_get` is Feast's own call with the same resolved service. A store whose
    layout the reader does not know is served by Feast's call.

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


_MAX_POSITION = 2**62  # below int64's limit; tests lower it to take the dense-rank path


def _point_in_time(settings: Settings, view: FeatureView, queries: pd.DataFrame) -> pd.DataFrame:
    """For each (key, time) query, the view's features from the entity's latest gold row with
    time - ttl <= event_timestamp <= time (ties on event time: the later created_timestamp, then the later
    row in scan order), or nulls. Returns `queries` (same rows, same order) with the features appended.

    Vectorised in numpy over Arrow: gold rows sorted by (entity, event time, created time) and each query
    placed among them by binary search (np.searchsorted), with (entity, time) packed into one int64. 30
    days of gold at 1M transactions a day are ~30M rows per view: pandas' sort, dedup and merge_asof of
    them peaked at 20 GiB and 73 s for the customer view; this keeps the Arrow table, a few int64 columns
    and the matched rows."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    key = _KEY_OF_VIEW[view.name]
    features = [f.name for f in view.features]
    lowest = queries[EVENT_TIMESTAMP].min() - view.ttl
    highest = queries[EVENT_TIMESTAMP].max()
    ts = pa.timestamp("us", tz="UTC")
    keys = pa.array(queries[key].unique(), type=pa.string())
    window = (
        (ds.field(PARTITION_COLUMN) >= lowest.date().isoformat())
        & (ds.field(PARTITION_COLUMN) <= highest.date().isoformat())
        & (ds.field(EVENT_TIMESTAMP) >= pa.scalar(lowest.to_pydatetime(), type=ts))
        & (ds.field(EVENT_TIMESTAMP) <= pa.scalar(highest.to_pydatetime(), type=ts))
        & pc.is_in(ds.field(key), value_set=keys)
    )
    dataset = _gold_dataset(settings.lake, _TABLE_OF_VIEW[view.name])
    gold = _normalise_timestamps(
        dataset.to_table(columns=[key, EVENT_TIMESTAMP, CREATED_TIMESTAMP, *features], filter=window)
    )
    gold_code = pc.index_in(gold[key], value_set=keys).to_numpy().astype(np.int64)
    gold_us = gold[EVENT_TIMESTAMP].cast(pa.int64()).to_numpy()
    created_us = gold[CREATED_TIMESTAMP].cast(pa.int64()).to_numpy()
    query_ns = queries[EVENT_TIMESTAMP].to_numpy(dtype="datetime64[ns]").astype(np.int64)
    query_us = np.floor_divide(query_ns, 1000)  # gold at or before t: gold_us <= floor(t in us)
    query_code = pd.Index(keys.to_pandas()).get_indexer(queries[key]).astype(np.int64)
    # (entity, time) as one sortable int64: entity * width + time since the earliest in play, or, when that
    # could overflow (a million entities and a TTL of years), + the time's rank among every time in play.
    first = min(int(gold_us.min(initial=query_us.min())), int(query_us.min()))
    width = max(int(gold_us.max(initial=0)), int(query_us.max())) - first + 1
    if width * max(len(keys), 1) < _MAX_POSITION:
        gold_pos = gold_code * width + (gold_us - first)
        query_pos = query_code * width + (query_us - first)
    else:
        times = np.sort(np.concatenate([gold_us, query_us]))
        times = times[np.concatenate(([True], times[1:] != times[:-1]))]
        gold_pos = gold_code * len(times) + np.searchsorted(times, gold_us)
        query_pos = query_code * len(times) + np.searchsorted(times, query_us)
    order = np.lexsort((created_us, gold_pos))  # stable: equal rows keep their scan order
    # Queries in order too: each binary search starts where the last one ended, in cache (2.3M queries
    # into 30M gold rows: 9 s in query order, a fraction of that sorted).
    by_position = np.argsort(query_pos, kind="stable")
    found = np.empty(len(query_pos), dtype=np.int64)
    found[by_position] = np.searchsorted(gold_pos[order], query_pos[by_position], side="right") - 1
    ttl_ns = int(view.ttl.total_seconds() * 1_000_000) * 1000
    if len(order):
        row = order[np.maximum(found, 0)]
        matched = (found >= 0) & (gold_code[row] == query_code) & (gold_us[row] * 1000 >= query_ns - ttl_ns)
    else:  # nothing in the window: every query gets nulls
        row, matched = np.zeros(len(found), dtype=np.int64), np.zeros(len(found), dtype=bool)
    values = gold.select(features).take(pa.array(row, mask=~matched))
    out = values.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    out.index = queries.index
    return pd.concat([queries, out], axis=1)


def require_gold(settings: Settings) -> None:
    """Raise GoldTableMissingError, naming the command that writes it, when a gold table has no partition."""
    for table in (CUSTOMER_TABLE, MERCHANT_TABLE):
        _gold_dataset(settings.lake, table)


def service_views(settings: Settings, project: str = DEFAULT_PROJECT) -> list[tuple[FeatureView, list[str]]]:
    """The feature service's views, each with the names of its features the service serves, as the
    registry holds them (importing Feast: seconds, which a caller may spend beside other work)."""
    store = open_store(settings, project)
    service = store.get_feature_service(FEATURE_SERVICE)
    return [
        (store.get_feature_view(projection.name), [f.name for f in projection.features])
        for projection in service.feature_view_projections
    ]


def historical_features(
    settings: Settings,
    entity_df: pd.DataFrame,
    project: str = DEFAULT_PROJECT,
    views: list[tuple[FeatureView, list[str]]] | None = None,
) -> pd.DataFrame:
    """`entity_df` (customer_id, merchant_id, event_timestamp, any other columns) with the fraud_model_v1
    features joined point in time: for each row and view, the entity's latest gold row with
    t - ttl <= event_timestamp <= t (event-time ties: the later created_timestamp), else nulls. Every input
    row comes back, in order (with a fresh 0..n-1 index). For the state just before a transaction, pass
    its event time minus 1 ms.

    The feature service, its views, features and TTLs come from the registry; the join itself is done
    here (`_point_in_time`, numpy over Arrow) over the gold partitions the request can reach, not by
    Feast's file offline store, which in 0.67 drops an entity row whose entity has rows but none within
    [t - ttl, t] (every customer's first transaction; a strict-xfail test pins it), broke
    created_timestamp ties nondeterministically and failed in dask's sort when several rows matched
    nothing (seen while writing the tests), and reads the whole table (features/README.md).

    `views`: the result of `service_views` for `project`, when the caller read the registry already."""
    import pandas as pd

    require_gold(settings)
    required = {CUSTOMER_JOIN_KEY, MERCHANT_JOIN_KEY, EVENT_TIMESTAMP}
    if not required <= set(entity_df.columns):
        raise FeatureStoreError(
            f"entity_df lacks columns {sorted(required - set(entity_df.columns))}; "
            f"it needs {sorted(required)}"
        )
    times = pd.to_datetime(entity_df[EVENT_TIMESTAMP])
    if times.dt.tz is None:
        raise FeatureStoreError(f"entity_df.{EVENT_TIMESTAMP} must be timezone-aware (UTC)")
    result = entity_df.assign(**{EVENT_TIMESTAMP: times.dt.tz_convert("UTC").astype("datetime64[ns, UTC]")})
    result = result.reset_index(drop=True)
    for view, served in service_views(settings, project) if views is None else views:
        key = _KEY_OF_VIEW[view.name]
        # One query per row, answered in row order: no dedup and merge back on (key, time), which cost
        # more than the join itself (20 s of a 2.3M-row training set).
        joined = _point_in_time(settings, view, result[[key, EVENT_TIMESTAMP]])
        result = pd.concat([result, joined[served]], axis=1)
    counts = [c for c in result.columns if c in INTEGER_FEATURES]
    return result.astype({c: "Int64" for c in counts})


def feast_historical_features(
    settings: Settings,
    entity_df: pd.DataFrame,
    project: str = DEFAULT_PROJECT,
    features: list[str] | None = None,
) -> pd.DataFrame:
    """Feast's own point-in-time join (file offline store) of the feature service, or of `features`
    ("view:feature" references); kept to compare against."""
    store = open_store(settings, project)
    wanted = features or store.get_feature_service(FEATURE_SERVICE)
    return store.get_historical_features(entity_df=entity_df, features=wanted).to_df()
