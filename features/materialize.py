"""Materialization: gold rows of a window into the online store, without Feast's engine.

Feast's local engine reads the whole window into one Arrow table before writing
(`retrieval_job.to_arrow()`), so memory grows with the window. Here a window is streamed from the gold
Parquet by Acero plans: the first pass keeps, per entity, only the key and timestamps of its latest row
(event time, then created time: two hash aggregations over three columns); the second streams every column
through a semi join with that table (its hash table built once) and writes the rows that are some entity's
latest in Feast's online layout, `WRITE_ROWS` entities per transaction or pipelines of `ENCODE_ROWS`
(features/online_store.py: the bytes Feast's `online_write_batch` would store, without its per-value
protobuf objects and statements). Memory is bounded by the number of entities in the window plus one
batch, not by the number of rows. tests/integration/test_feast_contract.py compares the result with
`FeatureStore.materialize` on the same gold.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from core import lineage
from core.settings import Settings
from features.feast_private import provider
from features.online_store import OnlineWriter, open_writer
from features.repo import DEFAULT_PROJECT, FeatureStoreError, apply, open_store
from features.sources import KEY_OF_VIEW, TABLE_OF_VIEW, gold_dataset
from pipelines.gold.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP, PARTITION_COLUMN

if TYPE_CHECKING:
    import pyarrow as pa
    from feast import FeatureStore, FeatureView

SCAN_ROWS = 250_000  # rows per Parquet batch
GUARD_ROWS = 10_000  # entities per read of stored event times (re-materializing an older window)
# Entities per write: one SQLite transaction in key order. Each transaction sweeps the B-trees once, so
# fewer, larger ones pay at many entities (docs/benchmarks.md); the Python objects of a write are bounded
# separately (features.online_store.ENCODE_ROWS).
WRITE_ROWS = 500_000


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
    # Entities whose online value came from an earlier load of this window and that the window's gold no
    # longer holds (rows retracted by a re-delivery): removed, or set back to their latest earlier gold row.
    entities_retracted: int = 0
    entities_restored: int = 0  # of those, set back to an earlier gold row (the others were removed)


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


def _window_rows(dataset, columns: list[str], window, batch_rows: int):
    """An Acero source of the window's rows (`columns`, timestamps normalised as normalise_timestamps
    does). Read-ahead is kept small: each batch in flight is memory. Pre-buffering (Arrow's default)
    reads a whole row group's column chunks ahead, which pays on object storage; gold is on a local disk,
    where it only adds to the memory of a scan (measured: see docs/benchmarks.md)."""
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
    the winners' hash table built once (a join per scanned batch rebuilt it for every batch, several times
    the memory and time; measured: see docs/benchmarks.md)."""
    plan = _semi_join(_window_rows(dataset, columns, window, batch_rows), winners, columns[:3])
    for batch in plan.to_reader(use_threads=True):
        if batch.num_rows:
            yield batch


def _entity_keys(view: FeatureView, keys: list[str]):
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    join_key = view.entity_columns[0].name
    return [EntityKey(join_keys=[join_key], entity_values=[Value(string_val=k)]) for k in keys]


def _one_per_entity(rows: pa.Table, key: str, columns: list[str]) -> pa.Table:
    """Two gold rows of one entity at the same latest event and created time (two transactions of a
    customer in the same millisecond) both match the winners: keep one, as Feast's own join keeps one of
    such ties. Columns are picked by name: Arrow's output order of keys and aggregates (keys first since
    pyarrow 25, last before) is not something to rely on."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.count_distinct(rows[key]).as_py() == rows.num_rows:
        return rows
    grouped = rows.group_by(key, use_threads=False).aggregate(
        [(name, "first") for name in columns if name != key]
    )
    return pa.table({name: grouped[name if name == key else f"{name}_first"] for name in columns})


def stored_times(store: FeatureStore, view: FeatureView, keys: list[str]) -> list[datetime | None]:
    """The event time of each entity's value in the online store (None: no value), read `GUARD_ROWS`
    entities at a time (Feast's SQLite read binds one parameter per entity, and SQLite takes at most
    32,766)."""
    online = provider(store)
    times: list[datetime | None] = []
    for offset in range(0, len(keys), GUARD_ROWS):
        stored = online.online_read(
            config=store.config,
            table=view,
            entity_keys=_entity_keys(view, keys[offset : offset + GUARD_ROWS]),
            requested_features=[view.features[0].name],
        )
        times += [None if ts is None else ts.replace(tzinfo=ts.tzinfo or UTC) for ts, _ in stored]
    return times


def _drop_stale(store: FeatureStore, view: FeatureView, rows: pa.Table, key: str, end: datetime) -> pa.Table:
    """Rows whose entity holds a value from a later window (an event at or after `end`) in the online store
    are left out, so that re-materializing an older window (late data) never moves an entity back in time.
    A stored value from this window or an earlier one is replaced, even by an older row: this window's gold
    was rebuilt and its latest row for the entity is now that one (a re-delivery retracted the later)."""
    import pyarrow as pa

    stored = stored_times(store, view, rows[key].to_pylist())
    keep = [ts is None or ts < end for ts in stored]
    return rows.filter(pa.array(keep, type=pa.bool_()))


def _manifest_path(folder: Path, view: FeatureView, start: datetime, end: datetime) -> Path:
    stamp = "%Y%m%dT%H%M%S%f"
    return folder / view.name / f"{start.strftime(stamp)}-{end.strftime(stamp)}.parquet"


def _write_manifest(path: Path, keys: pa.Table) -> None:
    """The entities a window's gold held when it was loaded (written aside, then renamed into place)."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_name(f".{path.name}.tmp")
    pq.write_table(keys, aside)
    os.replace(aside, path)


def _retract(
    store: FeatureStore,
    view: FeatureView,
    writer: OnlineWriter,
    dataset,
    manifest: Path,
    winners: pa.Table,
    start: datetime,
    end: datetime,
) -> tuple[int, int]:
    """Entities the window held at its previous load and holds no more (their rows were retracted by a
    re-delivery, or the date's gold removed): where the online value still comes from this window, it is
    set back to the entity's latest gold row before the window (within the view's TTL), or removed when
    there is none. Returns (entities retracted, of which restored)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    if not manifest.is_file():
        return 0, 0
    key = KEY_OF_VIEW[view.name]
    before = pq.read_table(manifest)[key]
    gone = pc.filter(before, pc.invert(pc.is_in(before, value_set=winners[key]))).to_pylist()
    if not gone:
        return 0, 0
    stored = stored_times(store, view, gone)
    stale = [k for k, ts in zip(gone, stored, strict=True) if ts is not None and start <= ts < end]
    if not stale:
        return 0, 0
    since = start - view.ttl if view.ttl else datetime(1970, 1, 1, tzinfo=UTC)
    earlier = _window_filter(since, start) & ds.field(key).isin(stale)
    columns = [key, EVENT_TIMESTAMP, CREATED_TIMESTAMP, *(f.name for f in view.features)]
    previous, _ = _window_winners(dataset, key, earlier, SCAN_ROWS)
    restored = 0
    if previous.num_rows:
        batches = list(_latest_rows(dataset, columns, earlier, previous, SCAN_ROWS))
        rows = _one_per_entity(pa.Table.from_batches(batches).combine_chunks(), key, columns)
        writer.write(rows)
        restored = rows.num_rows
    removed = sorted(set(stale) - set(previous[key].to_pylist()))
    if removed:
        writer.delete(removed)
    return len(stale), restored


def _materialize_view(
    store: FeatureStore,
    view: FeatureView,
    lake: Path,
    start: datetime,
    end: datetime,
    scan_rows: int,
    write_rows: int,
    manifests: Path | None = None,
) -> ViewMaterialization:
    import pyarrow as pa

    started = time.perf_counter()
    key = KEY_OF_VIEW[view.name]
    dataset = gold_dataset(lake, TABLE_OF_VIEW[view.name])
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
        rows = _one_per_entity(pa.Table.from_batches(pending).combine_chunks(), key, columns)
        pending, pending_rows = [], 0
        if guard:
            fresh = _drop_stale(store, view, rows, key, end)
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
        retracted = restored = 0
        if manifests is not None:
            manifest = _manifest_path(manifests, view, start, end)
            retracted, restored = _retract(store, view, writer, dataset, manifest, winners, start, end)
            _write_manifest(manifest, winners.select([key]))
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
        entities_retracted=retracted,
        entities_restored=restored,
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
    latest row in the window, unless the store holds a value from a later window for it. Rerunning a window
    after gold was rewritten (late data, a re-delivery) writes the rewritten rows, and an entity whose rows
    in the window were retracted goes back to its latest earlier gold row, or out of the store (each load
    keeps the window's entities in `feast/materialized/`, so the next load of it knows what left). Needs
    `apply` first."""
    start, end = _check_window(start, end)
    store = open_store(settings, project)
    registered = {v.name: v for v in store.list_feature_views()}
    wanted = views or list(TABLE_OF_VIEW)
    missing = [name for name in wanted if name not in registered]
    if missing:
        raise FeatureStoreError(
            f"feature views {missing} are not registered in project {project!r} "
            f"(registry {settings.feast_dir / 'registry.db'}); run features.repo.apply first"
        )
    manifests = settings.feast_dir / "materialized"
    return [
        _materialize_view(
            store, registered[name], settings.lake, start, end, scan_rows, write_rows, manifests
        )
        for name in wanted
    ]


def _materialized_lineage(settings: Settings, record: dict, day: date) -> lineage.Datasets:
    from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, PARTITION_COLUMN, table_path

    gold = [
        table_path(settings.lake, t) / f"{PARTITION_COLUMN}={day.isoformat()}"
        for t in (CUSTOMER_TABLE, MERCHANT_TABLE)
    ]
    return lineage.Datasets(
        [lineage.path(p) for p in gold if p.is_dir()],
        [lineage.online_store(settings, view) for view in record.get("materialized", {})],
    )


@lineage.emits("materialize", _materialized_lineage)
def materialize_date(settings: Settings, day: date) -> dict:
    """Apply the Feast definitions (idempotent) and load the date's UTC interval into the online store."""
    apply(settings)
    start = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    views = materialize(settings, start, start + timedelta(days=1))
    return {
        "rows_materialized": sum(v.rows_written for v in views),
        "materialized": {v.feature_view: v.rows_written for v in views},
    }


def erase_customers(settings: Settings, pseudonyms: set[str]) -> dict[str, int]:
    """The customers' entities in every online view keyed by the customer (the store knows them by pseudonym),
    removed with the writer that removes retracted entities (features/online_store.py); {view: entities
    removed}. No registry yet: nothing was ever materialized here. For an erasure (mlops/chain.py `erase`)."""
    from features.definitions import CUSTOMER_JOIN_KEY

    if not pseudonyms or not (settings.feast_dir / "registry.db").is_file():
        return {}
    store = open_store(settings)
    keys = sorted(pseudonyms)
    removed: dict[str, int] = {}
    for view in store.list_feature_views():
        if KEY_OF_VIEW.get(view.name) != CUSTOMER_JOIN_KEY:
            continue
        stored = stored_times(store, view, keys)
        present = [key for key, at in zip(keys, stored, strict=True) if at is not None]
        if not present:
            continue
        writer = open_writer(store, view)
        try:
            writer.delete(present)
        finally:
            writer.close()
        removed[view.name] = len(present)
    return removed
