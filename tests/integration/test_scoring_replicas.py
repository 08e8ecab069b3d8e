"""Several replicas of `mlops serve` with one exact live state (serving/replication.py): two processes behind
a round-robin router on 127.0.0.1 take concurrent traffic (transactions of shared customers and merchants,
chargebacks between them); one is killed in the middle and a third started; every request is answered, and
every answer's features equal what a single process gives when it is sent the same requests in the order
the replication log holds them. Real Redis (the machine's), real MLflow registry (SQLite), real ONNX."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from core import pseudonym
from core.settings import Settings
from serving.replication import decode, log_keys
from tests.conftest import wait_for
from tests.integration.test_scoring_service import (
    BEARER,
    Server,
    _promote,
    _register,
    _tracking,
    transaction,
)

pytestmark = pytest.mark.integration

REDIS_URL = "redis://127.0.0.1:6379/0"
REQUESTS = 360  # scoring requests in all; a chargeback every 30th
SENDERS = 4  # concurrent clients, so the replicas' batches interleave in the log


def _ready(server: Server) -> bool:
    try:
        return server.client.get("/v2/health/ready").status_code == 200
    except httpx.TransportError:
        return False


class Router:
    """Round robin over the replicas that are up, as a Service with a retrying client: a request that meets a
    closed connection or a 503 goes to the next replica, until it is answered."""

    def __init__(self, servers: list[Server]) -> None:
        self.servers = list(servers)
        self.lock = threading.Lock()
        self.turn = itertools.count()
        self.answered_by: dict[str, int] = {}

    def add(self, server: Server) -> None:
        with self.lock:
            self.servers.append(server)

    def remove(self, server: Server) -> None:
        with self.lock:
            if server in self.servers:
                self.servers.remove(server)

    def post(self, path: str, body) -> dict:
        answered: list[dict] = []

        def attempt() -> bool:
            with self.lock:
                server = self.servers[next(self.turn) % len(self.servers)]
            try:
                answer = httpx.post(server.url + path, json=body, headers=BEARER, timeout=30)
            except httpx.TransportError:
                return False  # a replica gone: the next one
            if answer.status_code == 503:
                return False  # one still loading or catching up: the next one
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:500])
            with self.lock:
                self.answered_by[server.url] = self.answered_by.get(server.url, 0) + 1
            answered.append(answer.json())
            return True

        wait_for(attempt, 120, f"an answer to {path}")
        return answered[0]


def _traffic() -> list[tuple[str, object]]:
    """Transactions of 25 customers at 8 merchants, in time order, a few as lists; chargebacks between."""
    plan: list[tuple[str, object]] = []
    for n in range(REQUESTS):
        items = [
            transaction(
                n * 3 + i,
                customer_id=f"c{(n * 7 + i) % 25:07d}",
                merchant_id=f"m{(n + i) % 8:06d}",
                event_timestamp=f"2026-01-10T{8 + n // 60:02d}:{n % 60:02d}:{i:02d}Z",
            )
            for i in range(3 if n % 10 == 0 else 1)
        ]
        plan.append(("/score", items if len(items) > 1 else items[0]))
        if n % 30 == 29:
            first = plan[-20][1]
            tid = (first if isinstance(first, dict) else first[0])["transaction_id"]
            label = f"2026-01-10T{8 + n // 60:02d}:{n % 60:02d}:30Z"
            plan.append(("/chargebacks", {"transaction_id": tid, "is_fraud": 1, "label_timestamp": label}))
    return plan


@pytest.fixture(scope="module")
def replicated(tmp_path_factory):
    home = tmp_path_factory.mktemp("replicas-home")
    (home / "mlflow").mkdir()
    _promote(home, _register(_tracking(home), home / "artifacts", seed=1))
    key = f"mlops:test:replicas:{uuid.uuid4().hex[:12]}"
    env = {
        "MLOPS_SERVING__REPLICATED": "true",
        "MLOPS_SERVING__REPLICATION_KEY": key,
        "MLOPS_CLUSTER__REDIS_URL": REDIS_URL,
        "MLOPS_SERVING__SHADOW": "false",
    }

    def start() -> Server:
        return Server(home, **env)

    yield home, key, start
    import redis

    redis.Redis.from_url(REDIS_URL).delete(*log_keys(key))


def _differences(got: dict, expected: dict) -> dict:
    return {name: (value, expected[name]) for name, value in got.items() if value != expected[name]}


def _send_all(router: Router, plan: list[tuple[str, object]], on_progress: Callable[[int], None]):
    """Send the plan with SENDERS threads, each request once (retried by the router until answered)."""
    answers: dict[int, dict] = {}
    cursor = iter(enumerate(plan))
    lock = threading.Lock()
    failures: list[BaseException] = []

    def sender() -> None:
        while True:
            with lock:
                try:
                    index, (path, body) = next(cursor)
                except StopIteration:
                    return
            try:
                answers[index] = router.post(path, body)
            except BaseException as exc:
                failures.append(exc)
                return
            on_progress(index)

    threads = [threading.Thread(target=sender) for _ in range(SENDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not failures, failures[0]
    return answers


def test_replicas_answer_every_request_with_the_state_a_single_process_would_have(replicated):
    import redis

    home, key, start = replicated
    first, second = start(), start()
    wait_for(lambda: _ready(first) and _ready(second), 180, "two replicas to be ready")
    router = Router([first, second])
    plan = _traffic()
    third: list[Server] = []
    killed = threading.Event()

    def kill_one_start_another(index: int) -> None:
        if index >= len(plan) // 3 and not killed.is_set():
            killed.set()
            router.remove(first)
            os.killpg(first.process.pid, signal.SIGKILL)  # no goodbye: in-flight requests are cut
            replacement = start()
            third.append(replacement)

            def join_when_ready() -> None:
                wait_for(lambda: _ready(replacement), 180, "the new replica")
                router.add(replacement)

            threading.Thread(target=join_when_ready, daemon=True).start()

    answers = _send_all(router, plan, kill_one_start_another)
    assert len(answers) == len(plan), "every request was answered"
    assert killed.is_set() and third
    wait_for(lambda: _ready(third[0]), 180, "the new replica to be ready")
    # the new replica took over the log: it applied what the others observed before and after it started
    status = third[0].client.get("/status").json()["replication"]
    assert status["problem"] is None and status["applied_from_others"] > 0
    # once it is in the router, it answers too: what it scores now follows everything before it
    for n in range(5):
        late_in_the_day = f"2026-01-10T20:00:0{n}Z"
        router.post(
            "/score",
            transaction(
                9_000 + n, customer_id="c0000001", merchant_id="m000001", event_timestamp=late_in_the_day
            ),
        )
    assert router.answered_by.get(third[0].url, 0) > 0 and router.answered_by.get(first.url, 0) > 0

    # The log, in order: the single process is sent exactly these requests, one at a time.
    client = redis.Redis.from_url(REDIS_URL)
    entries = [decode(fields[b"e"]) for _, fields in client.xrange(key, "-", "+")]
    keyed = pseudonym.for_settings(Settings(home=home))
    raw = {keyed.of("customer", f"c{i:07d}"): f"c{i:07d}" for i in range(25)}
    raw |= {keyed.of("merchant", f"m{i:06d}"): f"m{i:06d}" for i in range(8)}

    single = Server(home, MLOPS_SERVING__SHADOW="false")
    try:
        wait_for(lambda: _ready(single), 180, "the single process")
        expected: dict[str, dict] = {}  # transaction id -> features at its last place in the log
        for entry in entries:
            if entry["k"] == "c":
                for tid, when in entry["r"]:
                    body = {"transaction_id": tid, "is_fraud": 1, "label_timestamp": when.isoformat()}
                    assert single.client.post("/chargebacks", json=body).status_code == 200
                continue
            for unit in entry["u"]:
                body = [
                    {
                        **txn,
                        "customer_id": raw[txn["customer_id"]],
                        "merchant_id": raw[txn["merchant_id"]],
                        "event_timestamp": txn["event_timestamp"].isoformat(),
                    }
                    for txn in unit
                ]
                answer = single.client.post("/score", json=body)
                assert answer.status_code == 200, answer.text
                for result in answer.json():
                    expected[result["transaction_id"]] = result["features"]
    finally:
        single.stop()
        for server in (second, *third):
            server.stop()

    got = {}
    for index, answer in sorted(answers.items()):
        if plan[index][0] == "/score":
            for result in answer if isinstance(answer, list) else [answer]:
                got[result["transaction_id"]] = result["features"]
    assert got.keys() <= expected.keys(), "every answered transaction is in the log"
    differ = [
        (
            tid,
            {
                name: (value, expected[tid][name])
                for name, value in features.items()
                if value != expected[tid][name]
            },
        )
        for tid, features in got.items()
        if features != expected[tid]
    ]
    assert not differ, f"{len(differ)} of {len(got)} differ from the single process, first: {differ[:3]}"
    # the traffic did move state: velocity features were not all zero
    assert sum(1 for f in got.values() if f["customer_txn_count_1h"]) > len(got) // 2


def test_an_erasure_reaches_every_replica_at_one_point_of_the_log_and_trims_what_named_the_person(
    replicated,
):
    """`mlops erase` in the cluster: an erasure entry in the log; the replica that scored the person and the
    one that scores nothing both forget them (the idle one by its tick) and say so; the erasure then removes
    the log's earlier entries, which named them. A replica started afterwards, and the two, serve a state
    that never saw them."""
    import redis

    from serving.erasure import forget_in_service

    home, _, _ = replicated
    key = f"mlops:test:erasure:{uuid.uuid4().hex[:12]}"  # a log of its own: no replica of another test in it
    env = {
        "MLOPS_SERVING__REPLICATED": "true",
        "MLOPS_SERVING__REPLICATION_KEY": key,
        "MLOPS_CLUSTER__REDIS_URL": REDIS_URL,
        "MLOPS_SERVING__SHADOW": "false",
        "MLOPS_SERVING__REPLICATION_POLL_S": "0.3",
    }
    client = redis.Redis.from_url(REDIS_URL)
    # Serving live (no replay clock), as in the cluster: a replica that starts restores what the others
    # scored since the last landing from the scoring log, so the erasure may trim the log's earlier entries.
    busy, idle = Server(home, live_from=None, **env), Server(home, live_from=None, **env)
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    later = None
    try:
        wait_for(lambda: _ready(busy) and _ready(idle), 180, "two replicas to be ready")
        wait_for(lambda: client.hlen(f"{key}:replicas") == 2, 30, "both replicas to report")
        erased, merchant = "c0880001", "m088001"

        def score(server: Server, n: int, customer: str) -> dict:
            item = transaction(
                880 + n,
                customer_id=customer,
                merchant_id=merchant,
                event_timestamp=(start + timedelta(minutes=n)).isoformat(),
            )
            answer = server.client.post("/score", json=item)
            assert answer.status_code == 200, answer.text
            return answer.json()["features"]

        for n, customer in enumerate([erased, "c0880002", erased, erased]):
            score(busy, n, customer)
        settings = Settings(
            home=home,
            serving={"replicated": True, "replication_key": key, "erasure_wait_s": 60},
            cluster={"redis_url": REDIS_URL},
        )
        keyed = pseudonym.for_settings(settings)
        told = forget_in_service(settings, erased, keyed.customer(erased))
        assert told["status"] == "forgotten", told
        assert len(told["applied"]) == 2 and told["waiting"] == [], told
        assert told["earlier_entries_removed"] >= 4, told  # the person's batches are no longer in Redis
        entries = [decode(fields[b"e"]) for _, fields in client.xrange(key, "-", "+")]
        assert entries[0]["k"] == "e" and entries[0]["p"] == [keyed.customer(erased)]
        for server in (busy, idle):
            status = server.client.get("/status").json()["replication"]
            assert status["erasures_applied"] == 1 and status["problem"] is None, status
        # the idle replica, the busy one and one started now: a state that never saw the person
        later = Server(home, live_from=None, **env)
        wait_for(lambda: _ready(later), 180, "a replica started after the erasure")
        for n, server in enumerate((idle, busy, later), start=10):
            features = score(server, n, erased)
            # no history but what they did since, whichever replica scored it
            assert features["customer_txn_count_24h"] == ((n - 10) or None), (server.url, features)
            assert features["merchant_txn_count_24h"] == 1 + n - 10, (server.url, features)
    finally:
        for server in (busy, idle, later):
            if server is not None:
                server.stop()
        client.delete(*log_keys(key))
