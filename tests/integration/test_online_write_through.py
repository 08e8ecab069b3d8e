"""The live state's write-through to the online store (serving.features.StoreWrites), on a copy of the
reference lake's real Feast repository and SQLite online store: the writers are open before the state is
handed to the scorer (opening them imports Feast and reads the registry, seconds of CPU under the GIL that
stalled every request when the first write paid them mid-traffic), one write takes everything that queued
within a flush interval (a write per scored batch took half of the process's GIL time at 500 requests/s),
and the writer runs at a lower priority than the request path (docs/benchmarks.md, "Scoring service")."""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from core.settings import Settings
from features.definitions import CUSTOMER_JOIN_KEY, CUSTOMER_VIEW, MERCHANT_JOIN_KEY, MERCHANT_VIEW
from features.online import open_online
from pipelines.gold.contract import EVENT_TIMESTAMP
from serving.features import StoreWrites
from serving.threads import BACKGROUND_NICENESS
from tests import lake as reference
from tests.conftest import wait_for

WHEN = datetime(2026, 1, 20, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def settings(tmp_path_factory) -> Settings:
    copy = reference.reference_lake(tmp_path_factory.mktemp("write-through") / "home")
    return Settings(home=copy.home)


class CountedWrites(StoreWrites):
    """StoreWrites that also records each write it makes: its size and when it ended."""

    def __init__(self, *args, **kwargs) -> None:
        self.writes: list[tuple[int, float]] = []
        super().__init__(*args, **kwargs)

    def _write(self, pairs) -> None:
        super()._write(pairs)
        self.writes.append((len(pairs), time.monotonic()))  # once written: a test may read the store


def _pair(n: int) -> tuple[dict, dict]:
    customer = {CUSTOMER_JOIN_KEY: f"cwt{n:05d}", EVENT_TIMESTAMP: WHEN, "customer_txn_count_1h": n + 1}
    merchant = {MERCHANT_JOIN_KEY: f"mwt{n:05d}", EVENT_TIMESTAMP: WHEN, "merchant_txn_count_24h": n + 2}
    return customer, merchant


def test_the_writers_are_open_when_the_constructor_returns(settings):
    writes = StoreWrites(settings)
    try:
        assert set(writes.writers) == {CUSTOMER_VIEW, MERCHANT_VIEW}
        assert writes.problem is None
    finally:
        writes.close()


def test_what_is_put_within_a_flush_interval_is_one_write_and_reaches_the_store(settings):
    """After a write the writer waits out its interval: the batches put meanwhile, as a busy service puts
    one per request, go in the next interval's one write, not in a write each."""
    writes = CountedWrites(settings, flush_interval_s=0.5)
    try:
        writes.put([_pair(0)])
        wait_for(lambda: writes.writes, 30, "the first write")
        for n in range(1, 31):
            writes.put([_pair(n)])
        wait_for(lambda: len(writes.writes) == 2, 30, "the next interval's write")
        assert [size for size, _ in writes.writes] == [1, 30]
        assert writes.writes[1][1] - writes.writes[0][1] >= writes.flush_interval_s
        assert writes.written == 62 and writes.errors == 0
    finally:
        writes.close()
    entities = [{"customer_id": f"cwt{n:05d}", "merchant_id": f"mwt{n:05d}"} for n in range(31)]
    served = open_online(settings).get(entities)
    assert served["customer_txn_count_1h"] == [n + 1 for n in range(31)]
    assert served["merchant_txn_count_24h"] == [n + 2 for n in range(31)]


def test_the_writer_runs_at_a_lower_priority_than_the_request_path(settings):
    if sys.platform != "linux":
        pytest.skip("per-thread priorities are Linux's")
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    writes = StoreWrites(settings)
    try:
        writer = writes._thread.native_id
        assert os.getpriority(os.PRIO_PROCESS, writer) == min(19, base + BACKGROUND_NICENESS)
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base
    finally:
        writes.close()
