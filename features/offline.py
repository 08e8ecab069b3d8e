"""Offline reads: the point-in-time join of the feature service's views onto entity rows (training sets).

The join is done here over the gold partitions a request can reach, not by Feast's file offline store
(see `historical_features` for why); tests/integration/test_feast_contract.py runs Feast's
`get_historical_features` on the same data where Feast's store is correct and compares.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from core.settings import Settings
from features.definitions import CUSTOMER_JOIN_KEY, FEATURE_SERVICE, INTEGER_FEATURES, MERCHANT_JOIN_KEY
from features.repo import DEFAULT_PROJECT, FeatureStoreError, open_store
from features.sources import KEY_OF_VIEW, TABLE_OF_VIEW, gold_dataset, require_gold
from pipelines.gold.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP, PARTITION_COLUMN

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    from feast import FeatureView


def normalise_timestamps(table: pa.Table) -> pa.Table:
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


_MAX_POSITION = 2**62  # below int64's limit; tests lower it to take the dense-rank path


def _point_in_time(settings: Settings, view: FeatureView, queries: pd.DataFrame) -> pd.DataFrame:
    """For each (key, time) query, the view's features from the entity's latest gold row with
    time - ttl <= event_timestamp <= time (ties on event time: the later created_timestamp, then the later
    row in scan order), or nulls. Returns `queries` (same rows, same order) with the features appended.

    Vectorised in numpy over Arrow: gold rows sorted by (entity, event time, created time) and each query
    placed among them by binary search (np.searchsorted), with (entity, time) packed into one int64. 30
    days of gold at 1M transactions a day are ~30M rows per view: pandas' sort, dedup and merge_asof of
    them took many times the memory and time (measured: see docs/benchmarks.md); this keeps the Arrow
    table, a few int64 columns and the matched rows."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    key = KEY_OF_VIEW[view.name]
    features = [f.name for f in view.features]
    assert view.ttl is not None, "every view sets a ttl (features/definitions.py)"
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
    dataset = gold_dataset(settings.lake, TABLE_OF_VIEW[view.name])
    gold = normalise_timestamps(
        dataset.to_table(columns=[key, EVENT_TIMESTAMP, CREATED_TIMESTAMP, *features], filter=window)
    )
    query_ns = queries[EVENT_TIMESTAMP].to_numpy(dtype="datetime64[ns]").astype("int64")
    query_keys = pa.array(queries[key], type=pa.string(), from_pandas=True)
    values = match_latest(gold, key, query_keys, query_ns, view.ttl, features)
    out = values.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    out.index = queries.index
    return pd.concat([queries, out], axis=1)


def match_latest(
    gold: pa.Table,
    key: str,
    query_keys: pa.Array | pa.ChunkedArray,
    query_ns: np.ndarray,
    ttl: timedelta,
    columns: list[str] | None = None,
) -> pa.Table:
    """The row of `gold` each query (an entity key and a time in epoch nanoseconds) sees: the entity's
    latest row with time - ttl <= event_timestamp <= time (ties on event time: the later
    created_timestamp, then the later row of `gold`), or a null row; one row per query, in query order, of
    `columns` (default: all of `gold`'s). `gold` holds `key` and both timestamps as `normalise_timestamps`
    leaves them. Pure: the join itself, whoever read `gold` (`_point_in_time` from the lake,
    training/feature_rows.py from a day and what the day before carried).

    Vectorised in numpy over Arrow: gold rows sorted by (entity, event time, created time) and each query
    placed among them by binary search (np.searchsorted), with (entity, time) packed into one int64."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = pc.unique(query_keys)
    keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
    codes = pc.index_in(gold[key], value_set=keys)
    if codes.null_count:  # rows of entities no query asks for cannot match: leave them out
        gold = gold.filter(pc.is_valid(codes))
        codes = pc.index_in(gold[key], value_set=keys)
    gold_code = codes.to_numpy().astype(np.int64)
    gold_us = gold[EVENT_TIMESTAMP].cast(pa.int64()).to_numpy()
    created_us = gold[CREATED_TIMESTAMP].cast(pa.int64()).to_numpy()
    query_ns = np.asarray(query_ns, dtype=np.int64)
    query_us = np.floor_divide(query_ns, 1000)  # gold at or before t: gold_us <= floor(t in us)
    query_code = pc.index_in(query_keys, value_set=keys).to_numpy().astype(np.int64)
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
    # Queries in order too: each binary search starts where the last one ended, in cache (a fraction of
    # the time of the searches in query order; measured: see docs/benchmarks.md).
    by_position = np.argsort(query_pos, kind="stable")
    found = np.empty(len(query_pos), dtype=np.int64)
    found[by_position] = np.searchsorted(gold_pos[order], query_pos[by_position], side="right") - 1
    ttl_ns = int(ttl.total_seconds() * 1_000_000) * 1000
    if len(order):
        row = order[np.maximum(found, 0)]
        matched = (found >= 0) & (gold_code[row] == query_code) & (gold_us[row] * 1000 >= query_ns - ttl_ns)
    else:  # nothing in the window: every query gets nulls
        row, matched = np.zeros(len(found), dtype=np.int64), np.zeros(len(found), dtype=bool)
    return (gold if columns is None else gold.select(columns)).take(pa.array(row, mask=~matched))


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
    created_timestamp ties nondeterministically, failed in dask's sort when several rows matched
    nothing (seen while writing the tests), keeps one of several rows sharing a customer and a time, and
    reads the whole table (features/README.md).

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
        key = KEY_OF_VIEW[view.name]
        # One query per row, answered in row order: no dedup and merge back on (key, time), which cost
        # more than the join itself (measured: see docs/benchmarks.md).
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
