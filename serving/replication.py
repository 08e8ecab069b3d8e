"""Several replicas of the scoring service with one exact live state: every replica applies the same ordered
log of observations (state machine replication), a Redis stream the stack already runs.

Why a log: a transaction's features depend on every earlier transaction of its customer and its merchant,
and a merchant's customers arrive at every replica. Partitioning by customer at the ingress would leave each
merchant's state split across replicas; keeping the state in Redis would put a dozen reads on every request.
So each replica keeps the whole state in memory, as one process does, and the replicas agree on the order in
which transactions and chargebacks are observed.

How a batch is scored (`sync`, on the scorer's thread, under its lock): one Lua call appends the batch to the
stream (with a sequence number from a counter beside it) and returns every entry after the last one this
replica applied, its own last. The entries of other replicas are applied first, in order: each replica
applies an entry exactly as its origin did (the clock the origin put in it, then each request's refusal
check and its transactions, or the chargebacks), so every replica reaches the same state after the same
entries, and a request refused as late by its origin is refused the same way everywhere. Then the batch is
scored against that state, which holds exactly what came before it in the log. A single process fed the
same requests in the log's order gives the same features (tests/integration/test_scoring_replicas.py).

A replica that starts (a rollout, a node drain, a scale-up) loads the lake and the scoring log as a single
process does, then applies the whole stream: a transaction it already has is a resend to the state (the
same transaction id) and changes nothing, so nothing counts twice. It is ready once it has caught up.

An erasure (`mlops erase`, or POST /erasures) is an entry of the log too: every replica forgets the person
(LiveState.forget) at the same point of the order, so the replicas stay equal, and a replica that starts
forgets them after applying their earlier entries. An idle replica applies what the others appended every
`serving.replication_poll_s` (the service's tick, serving/app.py), and says in a hash beside the stream how
far it has applied, stamped with Redis's clock, never its own (a replica still loading says so too, with how
far its catch-up got): the erasure waits on that (`wait_applied`) before the files are rewritten, so no
replica writes a row of the person's to the scoring log after them, and trims the entries before it only
once every replica alive is past it.

Bounds: the stream keeps at most `serving.replication_max_entries` entries (Redis trims the oldest, roughly);
size it to hold the batches between two landings, since a replica that starts needs the ones the lake does
not have yet (the scoring log has them too, a few seconds behind). A replica that finds the sequence broken
(entries trimmed before it applied them) can no longer be exact: it stops scoring (503 with the reason,
readiness fails) until it is restarted and reloads.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from features.live import LiveState
    from serving.features import EntityState

log = logging.getLogger(__name__)

# KEYS[1] the stream, KEYS[2] its sequence counter; ARGV[1] the bound, ARGV[2] the entry, ARGV[3] the first
# id to return ("-" or "(<id>": after the last entry the caller applied).
_APPEND_AND_READ = """
local seq = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 's', seq, 'e', ARGV[2])
local entries = redis.call('XRANGE', KEYS[1], ARGV[3], '+')
return {id, entries}
"""
# KEYS[1] the stream, KEYS[2] its sequence counter; ARGV[1] the bound, ARGV[2] the entry: appended by a
# writer that applies nothing (the erasure's command); returns its sequence number.
_APPEND = """
local seq = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', 's', seq, 'e', ARGV[2])
return {seq, id}
"""
# KEYS[1] the replicas' hash; ARGV[1] this replica, ARGV[2] the last sequence it applied: stamped with Redis's
# clock (seconds), so no replica's clock decides which replicas are alive.
_REPORT = """
local now = redis.call('TIME')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ' ' .. now[1])
return now[1]
"""
CATCH_UP_COUNT = 5_000  # entries read per round trip while catching up at start
REPLICA_ALIVE_S = 30  # a replica that reported within this long is waited on by an erasure
REPLICA_FORGOTTEN_S = 86_400  # a replica silent this long is removed from the hash (gone for good)


def log_keys(key: str) -> tuple[str, str, str]:
    """Every Redis key a replication log `key` uses (the stream, its sequence counter, the replicas' hash):
    what removing a log removes."""
    return key, f"{key}:seq", f"{key}:replicas"


class ReplicationUnavailableError(RuntimeError):
    """The replication log cannot be used now: a batch is not scored (503, try again)."""


class ReplicationBrokenError(ReplicationUnavailableError):
    """The log lost entries this replica had not applied: its state can no longer be exact."""


def _fields(flat: list[bytes]) -> dict[bytes, bytes]:
    """A stream entry's fields as a Lua script returns them (a flat list: name, value, ...)."""
    return dict(zip(flat[::2], flat[1::2], strict=True))


def _timestamp(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def encode_units(units: list[list[dict[str, Any]]], now: datetime | None) -> bytes:
    return orjson.dumps({"k": "t", "n": now, "u": units})


def encode_chargebacks(reports: list[tuple[str, datetime]], now: datetime | None) -> bytes:
    return orjson.dumps({"k": "c", "n": now, "r": reports})


def encode_erasure(pseudonyms: list[str], now: datetime | None) -> bytes:
    return orjson.dumps({"k": "e", "n": now, "p": sorted(pseudonyms)})


def decode(raw: bytes) -> dict[str, Any]:
    entry = orjson.loads(raw)
    entry["n"] = _timestamp(entry["n"])
    if entry["k"] == "e":
        return entry
    if entry["k"] == "t":
        for unit in entry["u"]:
            for txn in unit:
                txn["event_timestamp"] = _timestamp(txn["event_timestamp"])
    else:
        entry["r"] = [(tid, datetime.fromisoformat(when)) for tid, when in entry["r"]]
    return entry


def apply(state: EntityState, live: LiveState | None, entry: dict[str, Any]) -> dict[str, int] | None:
    """An entry of another replica, as its origin applied it (see the module docstring); for an erasure,
    what it took from the state."""
    if entry["n"] is not None:
        state.advance(entry["n"])
    if entry["k"] == "e":
        return state.forget(entry["p"])
    if entry["k"] == "c":
        for tid, when in entry["r"]:
            state.observe_chargeback(tid, when)
        return None
    for unit in entry["u"]:
        if state.refusal(unit) is not None:
            continue  # its origin refused it (422) and kept none of it
        if live is not None:
            for txn in unit:
                live.observe(txn)  # the state only: the origin wrote its rows to the online store
        else:
            state.rows(unit)
    return None


@dataclass
class Replication:
    """This replica's place in the log. `client` is a redis-py client."""

    client: Any
    key: str
    max_entries: int
    last_id: str | None = None
    last_seq: int = 0
    applied: int = 0  # entries of other replicas applied
    erasures: int = 0  # erasure entries applied (LiveState.forget)
    # what the last few erasures applied took from the state, by sequence number (POST /erasures answers it)
    forgotten: dict[int, dict[str, int]] = field(default_factory=dict)
    problem: str | None = None
    _script: Any = field(default=None, repr=False)

    @classmethod
    def connect(cls, url: str, key: str, max_entries: int) -> Replication:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
        client.ping()
        return cls(client, key, max_entries)

    @property
    def sequence_key(self) -> str:
        return log_keys(self.key)[1]

    @property
    def replicas_key(self) -> str:
        return log_keys(self.key)[2]

    def append(self, entry: bytes) -> tuple[int, str]:
        """Append an entry this process does not apply itself (an erasure's); its sequence number and id.
        Raises ReplicationUnavailableError when Redis cannot be reached (whether it was appended is unknown:
        an erasure sent again is applied again, which takes nothing more)."""
        import redis

        try:
            seq, entry_id = self.client.eval(_APPEND, 2, self.key, self.sequence_key, self.max_entries, entry)
        except redis.exceptions.RedisError as exc:
            raise ReplicationUnavailableError(
                f"the replication log {self.key} cannot be reached ({exc}); try again"
            ) from exc
        return int(seq), entry_id.decode()

    def trim_before(self, entry_id: str) -> int:
        """Remove the entries before `entry_id` (an erasure's, once every replica alive has applied it and
        written what it scored: the scoring log holds what they held, and a replica that starts reads it);
        how many went. A replica that had not applied them finds its sequence broken and stops scoring until
        it restarts, never inexact."""
        return int(self.client.xtrim(self.key, minid=entry_id, approximate=False))

    def report(self, replica: str) -> None:
        """Say in the replicas' hash how far this replica has applied the log (`wait_applied` reads it)."""
        self.client.eval(_REPORT, 1, self.replicas_key, replica, self.last_seq)

    def wait_applied(self, seq: int, timeout_s: float, poll_s: float = 0.5) -> dict[str, Any]:
        """Wait until every replica alive (reported within REPLICA_ALIVE_S of Redis's clock) has applied the
        log up to `seq`, at most `timeout_s`. {"applied": [...], "waiting": [...]} by replica name; a replica
        silent for a day is removed from the hash."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = int(self.client.time()[0])
            applied: list[str] = []
            waiting: list[str] = []
            for name, value in self.client.hgetall(self.replicas_key).items():
                last, _, stamped = value.decode().partition(" ")
                age = now - int(stamped or 0)
                if age > REPLICA_FORGOTTEN_S:
                    self.client.hdel(self.replicas_key, name)
                elif age <= REPLICA_ALIVE_S:
                    (applied if int(last) >= seq else waiting).append(name.decode())
            if not waiting or time.monotonic() >= deadline:
                return {"applied": sorted(applied), "waiting": sorted(waiting)}
            time.sleep(poll_s)

    def _check(self, seq: int) -> None:
        if self.last_seq and seq != self.last_seq + 1:
            self.problem = (
                f"the replication log {self.key} lost entries {self.last_seq + 1}..{seq - 1} before this "
                "replica applied them (serving.replication_max_entries too small for how far it lagged): "
                "its state can no longer be exact; restart it to reload"
            )
            raise ReplicationBrokenError(self.problem)
        self.last_seq = seq

    def catch_up(self, state: EntityState, live: LiveState | None) -> int:
        """Apply every entry of the stream after the last applied (all of it at start); returns how many."""
        if self.problem:
            raise ReplicationBrokenError(self.problem)
        done = 0
        while True:
            start = "-" if self.last_id is None else f"({self.last_id}"
            entries = self.client.xrange(self.key, start, "+", count=CATCH_UP_COUNT)
            if not entries:
                return done
            for entry_id, fields in entries:
                if self.last_id is None:  # the stream's oldest kept entry: what came before is in the lake
                    self.last_seq = int(fields[b"s"]) - 1
                self._apply(state, live, entry_id, fields)
                done += 1

    def sync(self, state: EntityState, live: LiveState | None, entry: bytes) -> None:
        """Append `entry` (this replica's batch) and apply every entry before it; the caller then applies
        its own batch. Raises ReplicationUnavailableError (ReplicationBrokenError when entries were lost): the
        batch fails, its requests get a 503."""
        if self.problem:
            raise ReplicationBrokenError(self.problem)
        import redis

        if self._script is None:
            self._script = self.client.register_script(_APPEND_AND_READ)
        start = "-" if self.last_id is None else f"({self.last_id}"
        try:
            own_id, entries = self._script(
                keys=[self.key, self.sequence_key], args=[self.max_entries, entry, start]
            )
        except redis.exceptions.RedisError as exc:
            # nothing was applied; whether the entry was appended is unknown, so the others apply it as they
            # reach it, and so does this replica at its next batch: the caller's retry is a resend
            raise ReplicationUnavailableError(
                f"the replication log {self.key} cannot be reached ({exc}); try again"
            ) from exc
        *others, (last_id, last_fields) = [(entry_id, _fields(flat)) for entry_id, flat in entries]
        assert last_id == own_id, "the script reads up to its own entry"
        for entry_id, fields in others:
            self._apply(state, live, entry_id, fields)
        self._check(int(last_fields[b"s"]))
        self.last_id = own_id.decode()

    def _apply(self, state: EntityState, live: LiveState | None, entry_id: bytes, fields: dict) -> None:
        """Another replica's entry, after the last one applied (its sequence checked first)."""
        self._check(int(fields[b"s"]))
        entry = decode(fields[b"e"])
        taken = apply(state, live, entry)
        self.last_id = entry_id.decode()
        self.applied += 1
        if taken is not None:
            self.erasures += 1
            self.forgotten[self.last_seq] = taken
            while len(self.forgotten) > 16:
                del self.forgotten[min(self.forgotten)]

    def status(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "last_sequence": self.last_seq,
            "applied_from_others": self.applied,
            "erasures_applied": self.erasures,
            "problem": self.problem,
        }


def wait_for_redis(url: str, seconds: float = 60.0) -> None:
    """A replica starting beside its Redis: retry the first connection for a while."""
    import redis

    deadline = time.monotonic() + seconds
    while True:
        try:
            redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5).ping()
            return
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
