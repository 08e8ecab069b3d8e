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
    """StoreWrites that also records the size of each write it makes."""

    def __init__(self, *args, **kwargs) -> None:
        self.writes: list[int] = []
        super().__init__(*args, **kwargs)

    def _write(self, pairs) -> None:
        super()._write(pairs)
        self.writes.append(len(pairs))  # once written: a test that sees it may read the store


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
    """A scored batch every 10 ms for 0.3 s, as a service at a few hundred requests a second puts them:
    one write per interval (two where the interval's end falls inside), not one per batch."""
    writes = CountedWrites(settings, flush_interval_s=1.0)
    try:
        for n in range(30):
            writes.put([_pair(n)])
            time.sleep(0.01)  # the traffic's pace, not a wait for the writer
        wait_for(lambda: sum(writes.writes) == 30, 30, "the flush")
        assert len(writes.writes) <= 2, writes.writes
        assert writes.written == 60 and writes.errors == 0
    finally:
        writes.close()
    entities = [{"customer_id": f"cwt{n:05d}", "merchant_id": f"mwt{n:05d}"} for n in range(30)]
    served = open_online(settings).get(entities)
    assert served["customer_txn_count_1h"] == [n + 1 for n in range(30)]
    assert served["merchant_txn_count_24h"] == [n + 2 for n in range(30)]


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
