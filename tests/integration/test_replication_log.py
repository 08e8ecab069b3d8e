"""The replication log's own rules (serving/replication.py) on the machine's Redis, without a service: an
entry is applied by another replica as its origin applied it, a replica that starts applies the whole log,
and one that finds entries gone before it applied them stops (it can no longer be exact)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
import redis

from features.live import LiveState
from serving.features import LiveFeatures
from serving.replication import (
    Replication,
    ReplicationBrokenError,
    encode_chargebacks,
    encode_units,
    log_keys,
)

pytestmark = pytest.mark.integration

URL = "redis://127.0.0.1:6379/0"
NOW = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)


def _txn(n: int, customer: str = "pc" + "0" * 20) -> dict:
    return {
        "transaction_id": f"tx{n:016x}",
        "customer_id": customer,
        "merchant_id": "pm" + "0" * 20,
        "amount": 10.0 + n,
        "currency": "EUR",
        "country": "DE",
        "channel": "online",
        "merchant_category": "grocery",
        "event_timestamp": NOW.replace(minute=n),
    }


@pytest.fixture
def key():
    name = f"mlops:test:replication:{uuid.uuid4().hex[:12]}"
    yield name
    redis.Redis.from_url(URL).delete(*log_keys(name))


def _replica(key: str) -> tuple[Replication, LiveFeatures]:
    return Replication.connect(URL, key, 10_000), LiveFeatures(LiveState(), None)


def _score(replica: Replication, state: LiveFeatures, units: list[list[dict]]) -> list:
    """What the scorer does with a batch: the log first, then its own units."""
    replica.sync(state, state.live, encode_units(units, NOW))
    state.advance(NOW)
    return [state.rows(unit) for unit in units if state.refusal(unit) is None]


def test_each_replica_scores_after_everything_before_it_in_the_log(key):
    (a, state_a), (b, state_b) = _replica(key), _replica(key)
    _score(a, state_a, [[_txn(1)], [_txn(2)]])
    ((customer, _),) = _score(b, state_b, [[_txn(3)]])[0]
    assert customer["customer_txn_count_24h"] == 2, "b saw a's two transactions first"
    a.sync(state_a, state_a.live, encode_chargebacks([(_txn(1)["transaction_id"], NOW)], NOW))
    state_a.observe_chargeback(_txn(1)["transaction_id"], NOW)
    # a replica that starts now: the whole log, chargeback included, then it is where the others are
    c, state_c = _replica(key)
    assert c.catch_up(state_c, state_c.live) == 3 and c.last_seq == 3  # a batch an entry
    assert b.catch_up(state_b, state_b.live) == 1  # b meets a's chargeback at its next read of the log
    for state in (state_a, state_b, state_c):
        state.advance(NOW)
    rows = [s.rows([_txn(4)])[0] for s in (state_a, state_b, state_c)]
    assert rows[0] == rows[1] == rows[2]
    assert rows[0][1]["merchant_chargebacks_30d"] == 1 and rows[0][0]["customer_txn_count_24h"] == 3


def test_a_replica_that_finds_entries_gone_before_it_applied_them_stops(key):
    (a, state_a), (b, state_b) = _replica(key), _replica(key)
    _score(b, state_b, [[_txn(1)]])  # b has applied entry 1
    _score(a, state_a, [[_txn(2)]])
    _score(a, state_a, [[_txn(3)]])
    client = redis.Redis.from_url(URL)
    gone = [entry_id for entry_id, _ in client.xrange(key, "-", "+")][1:3]
    client.xdel(key, *gone)  # entries 2 and 3, as a trim would take them
    with pytest.raises(ReplicationBrokenError, match=r"lost entries 2\.\.3"):
        _score(b, state_b, [[_txn(4)]])
    assert b.problem and "restart it to reload" in b.problem
    with pytest.raises(ReplicationBrokenError):  # and stays stopped
        _score(b, state_b, [[_txn(5)]])
