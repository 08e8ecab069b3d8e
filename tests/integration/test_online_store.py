"""The fast online writers and reader against Feast's own, on the real SQLite and the Redis on this machine.

The same rows are written by `features.online_store`'s writer into one Feast project and by Feast's
`online_write_batch` into another; the stored bytes must be the same (SQLite rows, Redis hashes), and the
direct reader must return what Feast's `get_online_features` returns. Every test has its own projects;
their Redis keys are removed and checked gone afterwards.
"""

from __future__ import annotations

import math
import random
import sqlite3
import uuid
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from benchmarks.feature_store import DAY, write_gold_day
from core.settings import Settings
from features import materialize as materialization
from features import online, online_store, repo
from features.definitions import CUSTOMER_VIEW, INTEGER_FEATURES, MERCHANT_VIEW
from pipelines.gold.contract import CREATED_TIMESTAMP, EVENT_TIMESTAMP

TS = pa.timestamp("us", tz="UTC")


@pytest.fixture(params=["local", "cluster"])
def profile(request, monkeypatch):
    monkeypatch.setenv("MLOPS_PROFILE", request.param)
    return request.param


@pytest.fixture
def projects(profile):
    """Two Feast projects of this test alone; for Redis, their keys are removed and checked gone after
    (directly: Feast's teardown of the first project deletes the registry file both projects share)."""
    names = [f"t_{uuid.uuid4().hex[:10]}" for _ in range(2)]
    yield names
    if profile == "cluster":
        import redis

        client = redis.Redis.from_url(Settings().cluster.redis_url)
        for name in names:
            for key in client.scan_iter(match=f"*{name}", count=1000):
                client.delete(key)
            assert not list(client.scan_iter(match=f"*{name}", count=1000)), f"Redis keys of {name} left"


def adversarial_rows(view, keys: list[str], seed: int) -> pa.Table:
    """Rows of `view` with nulls, NaN, signed zeros, infinities, large and negative integers, non-ASCII
    keys and sub-second timestamps."""
    rng = random.Random(seed)
    doubles = [None, math.nan, -0.0, 0.0, math.inf, -math.inf, 1e-300, 123.0, -5.25]
    # Feast converts an integer column with nulls through float64, so beyond 2**53 it loses digits (and
    # fails at 2**63 - 1); the fast writer keeps them (tests/unit/test_online_value_encoding.py).
    integers = [None, 0, 1, 127, 128, -1, 2**53, -(2**53), 40]
    start = datetime(2026, 1, 7, tzinfo=UTC)
    events = [
        start + timedelta(seconds=rng.randrange(86_400), microseconds=rng.randrange(10**6)) for _ in keys
    ]
    columns = {
        view.entity_columns[0].name: pa.array(keys, pa.string()),
        EVENT_TIMESTAMP: pa.array(events, TS),
        CREATED_TIMESTAMP: pa.array([e + timedelta(hours=1, microseconds=7) for e in events], TS),
    }
    for f in view.features:
        if f.name in INTEGER_FEATURES:
            columns[f.name] = pa.array([rng.choice(integers) for _ in keys], pa.int64())
        else:
            pool = [*doubles, *(rng.uniform(-1e6, 1e6) for _ in range(5))]
            columns[f.name] = pa.array([rng.choice(pool) for _ in keys], pa.float64())
    return pa.table(columns)


def stored(settings: Settings, project: str, view, keys: list[str]) -> dict:
    """The raw stored form of `keys` in `view`: SQLite rows by (key, feature), or Redis hashes by key."""
    if settings.profile.value == "local":
        conn = sqlite3.connect(settings.feast_dir / "online.db")
        rows = conn.execute(
            "SELECT entity_key, feature_name, value, value_text, vector_value, event_ts, created_ts "
            f'FROM "{project}_{view.name}"'
        ).fetchall()
        conn.close()
        return {(r[0], r[1]): r[2:] for r in rows}
    import redis

    head = online_store._entity_key_head(view, 3)
    client = redis.Redis.from_url(settings.cluster.redis_url)
    out = {}
    for key in keys:
        raw = head + len(key.encode()).to_bytes(4, "little") + key.encode()
        out[raw] = client.hgetall(raw + project.encode())
    return out


def same(left: dict, right: dict) -> bool:
    """Equal dicts of lists, NaN equal to NaN."""
    if left.keys() != right.keys():
        return False
    for name in left:
        for a, b in zip(left[name], right[name], strict=True):
            both_nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
            if not (both_nan or (a == b and type(a) is type(b))):
                return False
    return True


def test_fast_writers_store_exactly_what_feast_stores(profile, projects):
    settings = Settings()
    ours, feasts = projects
    for name in projects:
        repo.apply(settings, name)
    stores = {name: repo.open_store(settings, name) for name in projects}
    customers = ["c1", "c2", "cliënt-ß", "客户-3", "c1000000", "c5"]
    merchants = ["m0", "m1", "m-ü"]
    for round_ in range(2):  # the second round updates every stored value (the upsert path)
        for view_name, keys in ((CUSTOMER_VIEW, customers), (MERCHANT_VIEW, merchants)):
            views = {name: stores[name].get_feature_view(view_name) for name in projects}
            rows = adversarial_rows(views[ours], keys, seed=round_)
            fast = online_store.open_writer(stores[ours], views[ours])
            expected_type = online_store.SqliteWriter if profile == "local" else online_store.RedisWriter
            assert type(fast) is expected_type
            fast.write(rows)
            fast.close()
            online_store.FeastWriter(stores[feasts], views[feasts]).write(rows)
            mine, theirs = (stored(settings, name, views[name], keys) for name in projects)
            assert len(mine) == len(keys) * (len(views[ours].features) if profile == "local" else 1)
            assert mine == theirs, f"{view_name}, round {round_}"
        requests = [
            {"customer_id": c, "merchant_id": m, "amount": 1.0}
            for c, m in zip(
                [*customers, "c-unknown", "c1"], [*merchants, *merchants, "m-unknown", "m1"], strict=True
            )
        ]
        served = {name: online.OnlineFeatures(stores[name]) for name in projects}
        assert served[ours]._reader is not None
        direct = served[ours].get(requests)
        assert same(direct, served[ours].feast_get(requests))
        assert same(direct, served[feasts].feast_get(requests))
        assert direct["customer_id"][-2:] == ["c-unknown", "c1"]
        assert all(direct[f.name][-2] is None for f in views[ours].features if view_name == MERCHANT_VIEW)


def test_direct_reads_equal_feasts_for_sampled_entities_after_materialize(profile, projects):
    settings = Settings()
    project = projects[0]
    write_gold_day(settings.lake, 20_000, seed=3)  # 2,000 customers, 20 merchants
    repo.apply(settings, project)
    reports = materialization.materialize(settings, DAY, DAY + timedelta(days=1), project, write_rows=700)
    assert sum(r.rows_written for r in reports) == 2_020
    served = online.open_online(settings, project)
    rng = random.Random(11)
    rows = [
        {"customer_id": f"c{rng.randrange(2_100)}", "merchant_id": f"m{rng.randrange(22)}"}
        for _ in range(300)
    ]
    assert same(served.get(rows), served.feast_get(rows))
    for row in rows[:40]:
        assert same(served.get([row]), served.feast_get([row]))
    assert sum(v is not None for v in served.get(rows)["customer_txn_count_1h"]) > 200


def test_the_sqlite_online_store_is_in_wal_mode_after_materialize(monkeypatch):
    monkeypatch.setenv("MLOPS_PROFILE", "local")
    settings = Settings()
    project = f"t_{uuid.uuid4().hex[:10]}"
    write_gold_day(settings.lake, 2_000)
    repo.apply(settings, project)
    materialization.materialize(settings, DAY, DAY + timedelta(days=1), project)
    conn = sqlite3.connect(settings.feast_dir / "online.db")
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    conn.close()


def test_a_request_without_a_join_key_is_refused_naming_it(profile, projects):
    settings = Settings()
    repo.apply(settings, projects[0])
    served = online.open_online(settings, projects[0])
    with pytest.raises(repo.FeatureStoreError, match="merchant_id"):
        served.get([{"customer_id": "c1"}])
    with pytest.raises(repo.FeatureStoreError, match="merchant_id"):
        served.get([{"customer_id": "c1", "merchant_id": "m1"}, {"customer_id": "c2"}])


def test_a_large_read_is_split_under_sqlites_parameter_limit(monkeypatch):
    monkeypatch.setenv("MLOPS_PROFILE", "local")
    monkeypatch.setattr(online_store, "READ_KEYS", 7)
    settings = Settings()
    project = f"t_{uuid.uuid4().hex[:10]}"
    write_gold_day(settings.lake, 2_000)  # 200 customers, 2 merchants
    repo.apply(settings, project)
    materialization.materialize(settings, DAY, DAY + timedelta(days=1), project)
    served = online.open_online(settings, project)
    rows = [{"customer_id": f"c{i}", "merchant_id": f"m{i % 3}"} for i in range(60)]
    got = served.get(rows)
    assert same(got, served.feast_get(rows))
    assert got["merchant_txn_count_24h"][2] is None and got["customer_txn_count_1h"].count(None) < 10


def test_two_gold_rows_of_an_entity_at_the_same_latest_time_materialize_one_of_them(monkeypatch):
    """Two transactions of a customer in the same millisecond give two gold rows with the same event and
    created time: materialization keeps one of them (as Feast's join does) instead of failing."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pipelines.gold.contract import CUSTOMER_TABLE, table_path

    monkeypatch.setenv("MLOPS_PROFILE", "local")
    settings = Settings()
    project = f"t_{uuid.uuid4().hex[:10]}"
    write_gold_day(settings.lake, 2_000)
    folder = table_path(settings.lake, CUSTOMER_TABLE) / f"event_date={DAY.date().isoformat()}"
    gold = pq.read_table(folder)
    latest = gold.filter(pc.equal(gold[EVENT_TIMESTAMP], pc.max(gold[EVENT_TIMESTAMP]))).slice(0, 1)
    customer = latest["customer_id"][0].as_py()
    twin = latest.set_column(
        latest.schema.get_field_index("customer_txn_count_1h"),
        "customer_txn_count_1h",
        pc.add(latest["customer_txn_count_1h"], 1),
    )
    pq.write_table(twin, folder / "twin.parquet")
    repo.apply(settings, project)
    reports = materialization.materialize(settings, DAY, DAY + timedelta(days=1), project)
    assert sum(r.rows_written for r in reports) == 200 + 2  # one row per entity: 200 customers, 2 merchants
    served = online.open_online(settings, project)
    value = served.get([{"customer_id": customer, "merchant_id": "m0"}])["customer_txn_count_1h"][0]
    assert value in {latest["customer_txn_count_1h"][0].as_py(), twin["customer_txn_count_1h"][0].as_py()}


def _customer_gold(rows: list[tuple[str, datetime, int]]) -> pa.Table:
    """Customer gold rows (key, event time, a value every feature carries)."""
    from pipelines.gold.contract import CUSTOMER_FEATURES

    columns = {
        "customer_id": pa.array([r[0] for r in rows], pa.string()),
        EVENT_TIMESTAMP: pa.array([r[1] for r in rows], TS),
        CREATED_TIMESTAMP: pa.array([r[1] + timedelta(minutes=5) for r in rows], TS),
    }
    for name in CUSTOMER_FEATURES:
        kind = pa.int64() if name in INTEGER_FEATURES else pa.float64()
        columns[name] = pa.array([r[2] for r in rows], kind)
    return pa.table(columns)


def _write_customer_day(settings: Settings, day: datetime, rows: list[tuple[str, datetime, int]]) -> None:
    import shutil

    import pyarrow.parquet as pq

    from pipelines.gold.contract import CUSTOMER_TABLE, table_path

    folder = table_path(settings.lake, CUSTOMER_TABLE) / f"event_date={day.date().isoformat()}"
    shutil.rmtree(folder, ignore_errors=True)
    if rows:
        folder.mkdir(parents=True)
        pq.write_table(_customer_gold(rows), folder / "part-0.parquet")


def test_reloading_a_rebuilt_date_follows_gold_when_rows_were_retracted(profile, projects):
    """A re-delivery retracts rows of a date whose gold was loaded already: the reload sets each entity to
    its latest gold row again, even an older one (c1), an earlier date's (c2), or none at all (c3), while
    an entity whose value comes from a later date keeps it (c4)."""
    settings = Settings()
    project = projects[0]
    first, second, third = DAY - timedelta(days=1), DAY, DAY + timedelta(days=1)
    _write_customer_day(settings, first, [("c1", first + timedelta(hours=1), 1), ("c2", first, 2)])
    _write_customer_day(
        settings,
        second,
        [
            ("c1", second + timedelta(hours=1), 11),
            ("c1", second + timedelta(hours=9), 12),
            ("c2", second + timedelta(hours=2), 21),
            ("c3", second + timedelta(hours=3), 31),
            ("c4", second + timedelta(hours=4), 41),
        ],
    )
    _write_customer_day(settings, third, [("c4", third + timedelta(hours=1), 42)])
    repo.apply(settings, project)

    def load(day: datetime) -> list[materialization.ViewMaterialization]:
        return materialization.materialize(settings, day, day + timedelta(days=1), project, [CUSTOMER_VIEW])

    def values() -> list:
        served = online.open_online(settings, project)
        rows = [{"customer_id": c, "merchant_id": "m0"} for c in ("c1", "c2", "c3", "c4")]
        return served.get(rows)["customer_txn_count_1h"]

    for day in (first, second, third):
        load(day)
    assert values() == [12, 21, 31, 42]

    # The producer re-delivers the second date without c1's later row, c2's and c3's rows, and c4's.
    _write_customer_day(settings, second, [("c1", second + timedelta(hours=1), 11)])
    (report,) = load(second)
    assert values() == [11, 2, None, 42]
    assert (report.entities_retracted, report.entities_restored) == (2, 1)
    served = online.open_online(settings, project)
    rows = [{"customer_id": c, "merchant_id": "m0"} for c in ("c1", "c2", "c3", "c4")]
    assert same(served.get(rows), served.feast_get(rows))
