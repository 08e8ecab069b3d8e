"""The scoring service's live entity state against gold built by Spark, and the online reader's stored times.

Three days of synthetic silver (landed by the generator, written by Arrow) plus hand-placed edge rows, gold
built by the real Spark job for each date. Then, for the last date D, `LiveState.from_lake` at the start of
D, D's chargebacks and transactions replayed in time order: every row `observe` returns equals D's gold row
of that transaction, and what `state_before` serves for each transaction equals the training set's point in
time join (features.offline.historical_features at event time - 1 ms).

The edge rows sit exactly on each window's bound (t - 1h, t - 24h, t - 7d, t - 30d: out; 1 ms later: in),
two transactions share a millisecond, one arrives a day late (an event of D-1 in arrival D, before the
start), chargebacks are reported exactly 30 days before t (out), 1 ms later (in) and at t (in), and two
customers test how far back gold finds a previous transaction: a late event of D-31 that arrived on D-30
counts, one that arrived on D-31 does not.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.gold import write_silver
from core.settings import Settings
from features.definitions import INTEGER_FEATURES
from features.live import CHARGEBACK_REACH_DAYS, LiveState
from pipelines.gold import job as gold
from pipelines.gold.contract import (
    CUSTOMER_FEATURES,
    CUSTOMER_TABLE,
    EVENT_TIMESTAMP,
    MERCHANT_FEATURES,
    MERCHANT_TABLE,
    table_path,
)
from pipelines.synthetic.landing import GenerateRequest, generate_landing

FIRST = date(2026, 1, 5)
DAYS = 3
LAST = FIRST + timedelta(days=DAYS - 1)
START = datetime(LAST.year, LAST.month, LAST.day, tzinfo=UTC)
T = START + timedelta(hours=12)  # the edge customer's transaction time
MS = timedelta(milliseconds=1)
EDGE_CUSTOMER, EDGE_MERCHANT = "c9000001", "m900001"
GAP_COUNTED, GAP_UNSEEN = "c9000002", "c9000003"  # previous transaction found / out of gold's reach


def _tid(name: str) -> str:
    return "tx" + uuid.uuid5(uuid.NAMESPACE_URL, name).hex[:16]


# (name, customer, event time, arrival date, country): the edge transactions, all at the edge merchant.
EDGES = [
    ("31d-late", EDGE_CUSTOMER, T - timedelta(days=31), LAST - timedelta(days=30), "US"),
    ("30d-out", EDGE_CUSTOMER, T - timedelta(days=30), LAST - timedelta(days=30), "FR"),
    ("30d-in", EDGE_CUSTOMER, T - timedelta(days=30) + MS, LAST - timedelta(days=30), "US"),
    ("7d-out", EDGE_CUSTOMER, T - timedelta(days=7), LAST - timedelta(days=7), "US"),
    ("7d-in", EDGE_CUSTOMER, T - timedelta(days=7) + MS, LAST - timedelta(days=7), "FR"),
    ("24h-out", EDGE_CUSTOMER, T - timedelta(days=1), LAST - timedelta(days=1), "US"),
    ("24h-in", EDGE_CUSTOMER, T - timedelta(days=1) + MS, LAST - timedelta(days=1), "US"),
    ("late", EDGE_CUSTOMER, START - timedelta(minutes=30), LAST, "US"),  # an event of D-1 arriving on D
    ("1h-out", EDGE_CUSTOMER, T - timedelta(hours=1), LAST, "US"),
    ("1h-in", EDGE_CUSTOMER, T - timedelta(hours=1) + MS, LAST, None),  # no country: abroad, as in gold
    ("at-t", EDGE_CUSTOMER, T, LAST, "US"),
    ("at-t-tie", EDGE_CUSTOMER, T, LAST, "US"),  # same millisecond: each one's windows hold the other
    ("gap-late", GAP_COUNTED, START - timedelta(days=30, hours=1), LAST - timedelta(days=30), "US"),
    ("gap-counted", GAP_COUNTED, START + timedelta(hours=1), LAST, "US"),
    ("gap-old", GAP_UNSEEN, START - timedelta(days=30, hours=1), LAST - timedelta(days=31), "US"),
    ("gap-unseen", GAP_UNSEEN, START + timedelta(hours=2), LAST, "US"),
]
# (transaction, report time, arrival date): fraud chargebacks at the edge merchant.
EDGE_CHARGEBACKS = [
    ("31d-late", T - timedelta(days=30), LAST - timedelta(days=30)),  # exactly 30 days before t: out
    ("30d-out", T - timedelta(days=30) + MS, LAST - timedelta(days=30)),  # 1 ms later: in
    ("7d-out", T, LAST),  # reported at t: counts for the transactions at t
]


def _add_edges(lake) -> None:
    """Append the edge rows to the silver partitions of their arrival dates (made where missing)."""
    for stem, rows in (("transactions", EDGES), ("labels", EDGE_CHARGEBACKS)):
        by_arrival: dict[date, list] = {}
        for row in rows:
            by_arrival.setdefault(row[2] if stem == "labels" else row[3], []).append(row)
        template = pq.read_table(next((lake / "silver" / stem).glob("arrival_date=*/*.parquet")))
        for arrival, items in by_arrival.items():
            path = lake / "silver" / stem / f"arrival_date={arrival}" / "part-00000.parquet"
            table = pq.read_table(path) if path.exists() else template.schema.empty_table()
            extra = []
            for i, item in enumerate(items):
                base = dict.fromkeys(table.schema.names) | {"source_file": "edges.csv", "line_number": i + 2}
                if stem == "transactions":
                    name, customer, when, _, country = item
                    base |= {
                        "transaction_id": _tid(name),
                        "customer_id": customer,
                        "merchant_id": EDGE_MERCHANT,
                        "event_timestamp": when,
                        "event_date": when.date(),
                        "amount": Decimal("12.34") * (i + 1),
                        "currency": "USD",
                        "country": country,
                    }
                else:
                    name, when, _ = item
                    base |= {"transaction_id": _tid(name), "is_fraud": 1, "label_timestamp": when}
                extra.append(base)
            path.parent.mkdir(parents=True, exist_ok=True)
            merged = pa.concat_tables([table, pa.Table.from_pylist(extra, schema=table.schema)])
            pq.write_table(merged, path, compression="zstd")


@pytest.fixture(scope="module")
def lake(tmp_path_factory, spark):
    settings = Settings(home=tmp_path_factory.mktemp("live") / "home", spark_shuffle_partitions=2)
    generate_landing(
        GenerateRequest(
            start=FIRST,
            days=DAYS,
            rows_per_day=1000,
            seed=17,
            landing=settings.landing,
            customers=90,
            merchants=30,
        )
    )
    write_silver(settings.landing, settings.lake)
    _add_edges(settings.lake)
    for offset in range(DAYS):
        gold.build_gold(settings, FIRST + timedelta(days=offset))
    return settings


def _ms(when: datetime) -> int:
    return (when - datetime(1970, 1, 1, tzinfo=UTC)) // MS


def _silver(lake, stem: str) -> list[dict]:
    import pyarrow.dataset as ds

    partitioning = ds.partitioning(pa.schema([("arrival_date", pa.date32())]), flavor="hive")
    return ds.dataset(lake / "silver" / stem, partitioning=partitioning).to_table().to_pylist()


def _mismatches(actual: dict | None, expected: dict | None, names) -> list[str]:
    """Features that differ: integers exactly, floats to 1e-9 (relative or absolute), nulls as nulls."""
    if actual is None or expected is None:
        return [] if actual is expected else [f"{actual} != {expected}"]
    out = []
    for name in names:
        a, e = actual[name], expected[name]
        if e is None or a is None or name in INTEGER_FEATURES:
            same = a == e and type(a) is type(e)
        else:
            same = math.isclose(a, e, rel_tol=1e-9, abs_tol=1e-9)
        if not same:
            out.append(f"{name}: {a!r} != {e!r}")
    return out


def _matches_one(row: dict, candidates: list[dict], names) -> list[str]:
    """Empty when `row` equals one of the gold rows of its entity and time (several for a tie), else
    what differs from the first."""
    found = [_mismatches(row, c, names) for c in candidates]
    return [] if any(not f for f in found) else found[0]


def _joined(frame, i: int, names) -> dict | None:
    """Row i of a point-in-time join as Python values (None where null), None when the view matched
    nothing."""
    values = frame.iloc[i]
    if values[names[0]] is pd.NA or values[names[0]] != values[names[0]]:
        return None
    return {
        n: None
        if values[n] is pd.NA or values[n] != values[n]
        else (int if n in INTEGER_FEATURES else float)(values[n])
        for n in names
    }


@dataclass
class Replay:
    """D replayed through a LiveState bootstrapped at the start of D."""

    settings: Settings
    live: LiveState
    transactions: list[dict]  # silver transactions of D, in (event time, id) order
    served: list[tuple[dict | None, dict | None]]  # state_before each transaction
    returned: list[tuple[dict, dict]]  # what observe returned for each
    attributed: int  # chargebacks of D that observe_chargeback attributed
    gold: dict[tuple[str, str, datetime], list[dict]]  # D's gold rows by (key, entity, event time)


@pytest.fixture(scope="module")
def replay(lake) -> Replay:
    gold_rows: dict[tuple[str, str, datetime], list[dict]] = {}
    for table, key in ((CUSTOMER_TABLE, "customer_id"), (MERCHANT_TABLE, "merchant_id")):
        for row in pq.read_table(table_path(lake.lake, table) / f"event_date={LAST}").to_pylist():
            gold_rows.setdefault((key, row[key], row[EVENT_TIMESTAMP]), []).append(row)
    transactions = sorted(
        (t for t in _silver(lake.lake, "transactions") if t["event_date"] == LAST),
        key=lambda t: (t["event_timestamp"], t["transaction_id"]),
    )
    chargebacks = sorted(
        (c["label_timestamp"], c["transaction_id"])
        for c in _silver(lake.lake, "labels")
        if c["is_fraud"] == 1 and c["label_timestamp"] >= START
    )
    live = LiveState.from_lake(lake, START)
    served, returned, attributed, fed = [], [], 0, 0
    for txn in transactions:
        # A chargeback counts from its report time on, including a transaction in the same millisecond.
        while fed < len(chargebacks) and _ms(chargebacks[fed][0]) <= _ms(txn["event_timestamp"]):
            attributed += live.observe_chargeback(chargebacks[fed][1], chargebacks[fed][0])
            fed += 1
        served.append(live.state_before(txn["customer_id"], txn["merchant_id"], txn["event_timestamp"]))
        returned.append(live.observe(txn))
    return Replay(lake, live, transactions, served, returned, attributed, gold_rows)


TIE = sorted([_tid("at-t"), _tid("at-t-tie")])
VIEWS = (("customer_id", CUSTOMER_FEATURES), ("merchant_id", MERCHANT_FEATURES))


def test_observe_returns_the_gold_rows_of_each_transaction(replay):
    """Every row observe returns is the transaction's gold row, except the first of two transactions in
    one millisecond, whose rows cannot include the second yet: rows_of gives the complete rows after it."""
    from pipelines.gold import state

    assert CHARGEBACK_REACH_DAYS == state.CHARGEBACK_REACH_DAYS  # live.py's copy of the constant
    rows_of_day = sum(len(v) for k, v in replay.gold.items() if k[0] == "customer_id")
    assert len(replay.transactions) == rows_of_day > 800
    assert replay.attributed > 3, "too few chargebacks reported on the replayed date: nothing is tested"
    charged = [
        row
        for (key, entity, _), rows in replay.gold.items()
        if key == "merchant_id" and entity != EDGE_MERCHANT
        for row in rows
        if row["merchant_chargebacks_30d"]
    ]
    assert len(charged) > 20, "too few merchant rows with chargebacks: nothing is tested"
    for txn, returned in zip(replay.transactions, replay.returned, strict=True):
        complete = replay.live.rows_of(txn["transaction_id"])
        assert complete is not None
        for index, (key, names) in enumerate(VIEWS):
            candidates = replay.gold[(key, txn[key], txn["event_timestamp"])]
            where = (txn["transaction_id"], key, txn["event_timestamp"])
            assert not _matches_one(complete[index], candidates, names), (
                where,
                _matches_one(complete[index], candidates, names),
            )
            if txn["transaction_id"] != TIE[0]:
                assert not _matches_one(returned[index], candidates, names), (
                    where,
                    _matches_one(returned[index], candidates, names),
                )


def test_window_edges_ties_and_the_reach_of_seconds_since_previous(replay):
    live = replay.live
    ids = [t["transaction_id"] for t in replay.transactions]
    first_of_tie = replay.returned[ids.index(TIE[0])]
    assert first_of_tie[0]["customer_txn_count_1h"] == 2  # 1h-in and itself; gold's 3 include the tie
    edge = [live.rows_of(t) for t in TIE]
    assert edge[0] is not None and edge[1] is not None
    # At t: itself and its tie, plus the "-in" rows of each window (and the late one within 24h).
    assert [edge[0][0][f"customer_txn_count_{w}"] for w in ("1h", "24h", "7d", "30d")] == [3, 6, 8, 10]
    assert edge[0][1]["merchant_chargebacks_30d"] == 2  # reported 30 days before t + 1 ms, and at t
    assert [rows[0]["customer_seconds_since_previous"] for rows in edge] == [3600 - 0.001, 0.0]
    after, _ = live.state_before(EDGE_CUSTOMER, EDGE_MERCHANT, T + timedelta(seconds=1))
    assert after == edge[1][0]  # the state after both: the tie's row with the larger id
    first_rows = {t["customer_id"]: r[0] for t, r in zip(replay.transactions, replay.returned, strict=True)}
    assert first_rows[GAP_COUNTED]["customer_seconds_since_previous"] == 30 * 86_400 + 2 * 3600
    assert first_rows[GAP_UNSEEN]["customer_seconds_since_previous"] is None


def test_state_before_each_transaction_is_what_the_training_set_joins(replay):
    from features.definitions import build_definitions
    from features.offline import historical_features

    transactions = replay.transactions
    definitions = build_definitions(replay.settings.lake)
    views = [(v, [f.name for f in v.features]) for v in definitions.feature_views]
    requests = pd.DataFrame(
        {
            "customer_id": [t["customer_id"] for t in transactions],
            "merchant_id": [t["merchant_id"] for t in transactions],
            EVENT_TIMESTAMP: pd.to_datetime([t["event_timestamp"] - MS for t in transactions], utc=True),
        }
    )
    joined = historical_features(replay.settings, requests, views=views)  # as training.dataset joins
    known = 0
    for i, pair in enumerate(replay.served):
        for row, (_, names) in zip(pair, VIEWS, strict=True):
            expected = _joined(joined, i, names)
            assert not _mismatches(row, expected, names), (
                transactions[i]["transaction_id"],
                _mismatches(row, expected, names),
            )
            known += row is not None
    assert known > len(transactions)  # most transactions have a state before them, of both entities


@pytest.fixture(params=["local", "cluster"])
def project(request, monkeypatch):
    """A Feast project of this test alone, in the profile's online store (SQLite, or the Redis on this
    machine, whose keys of the project are removed afterwards)."""
    monkeypatch.setenv("MLOPS_PROFILE", request.param)
    name = f"t_{uuid.uuid4().hex[:10]}"
    yield name
    if request.param == "cluster":
        import redis

        client = redis.Redis.from_url(Settings().cluster.redis_url)
        for key in client.scan_iter(match=f"*{name}", count=1000):
            client.delete(key)


def test_the_reader_returns_each_views_stored_event_time(project):
    """`read(..., with_times=True)` adds each view's stored event time: what Feast's own online_read
    returns (SQLite: whole seconds), None for an entity the store does not hold; the values are those of
    the default read."""
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    from features import online, online_store, repo
    from features.definitions import CUSTOMER_VIEW, MERCHANT_VIEW
    from features.feast_private import provider
    from tests.integration.test_online_store import adversarial_rows

    settings = Settings()
    repo.apply(settings, project)
    store = repo.open_store(settings, project)
    keys = {CUSTOMER_VIEW: ["c1", "c2"], MERCHANT_VIEW: ["m1"]}
    written = {}
    for name, entities in keys.items():
        view = store.get_feature_view(name)
        rows = adversarial_rows(view, entities, seed=5)  # event times with microseconds
        writer = online_store.open_writer(store, view)
        writer.write(rows)
        writer.close()
        written[name] = dict(zip(entities, rows[EVENT_TIMESTAMP].to_pylist(), strict=True))
    reader = online.OnlineFeatures(store)._reader
    assert reader is not None
    requests = [
        {"customer_id": "c1", "merchant_id": "m1"},
        {"customer_id": "c2", "merchant_id": "m-unknown"},
        {"customer_id": "c-unknown", "merchant_id": "m1"},
    ]
    plain = reader.read(requests)
    timed = reader.read(requests, with_times=True)
    times = {k.removeprefix(online_store.TIMES_PREFIX): v for k, v in timed.items() if k not in plain}
    assert {k: timed[k] for k in plain} == plain
    assert set(times) == set(keys)
    sqlite = settings.profile.value == "local"
    for name, column in ((CUSTOMER_VIEW, "customer_id"), (MERCHANT_VIEW, "merchant_id")):
        expected = [written[name].get(r[column]) for r in requests]
        if sqlite:  # Feast's sqlite3 adapter keeps whole seconds
            expected = [e and e.replace(microsecond=0) for e in expected]
        assert times[name] == expected, name
        assert all(t is None or t.tzinfo is not None for t in times[name])
        view = store.get_feature_view(name)
        entity_keys = [
            EntityKey(join_keys=[column], entity_values=[Value(string_val=r[column])]) for r in requests
        ]
        feasts = [
            ts
            for ts, _ in provider(store).online_read(config=store.config, table=view, entity_keys=entity_keys)
        ]
        if not sqlite:  # for a key it does not hold, Feast's Redis read gives the epoch, not None
            feasts = [None if e is None else ts for ts, e in zip(feasts, expected, strict=True)]
        for ours, theirs in zip(times[name], feasts, strict=True):  # Feast's Redis read goes through a float
            assert ours == theirs or abs(ours - theirs) <= timedelta(microseconds=1), (name, ours, theirs)
