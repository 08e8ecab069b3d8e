"""The promotion history: an append-only table of every gate decision, promotion and rollback, and the
lock that makes "read the champion, decide, record, move the alias" one step.

It lives in a SQL database next to the MLflow registry (SQLite under $MLOPS_HOME locally, the cluster's
PostgreSQL otherwise). The database refuses UPDATE and DELETE on the table (triggers), so history cannot
be rewritten by this code or by a careless hand. The lock: PostgreSQL takes an advisory session lock per
model name; SQLite takes its write lock up front (BEGIN IMMEDIATE). Two candidates finishing together are
therefore decided one after the other, the second against the first's outcome. The history is the source
of truth for the champion: a promotion commits its row (`Ledger.commit`) before it moves the alias.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import sqlalchemy as sa

from model_contract.promotion_history import TABLE as TABLE
from model_contract.promotion_history import Decision as Decision
from model_contract.promotion_history import LedgerAccessError as LedgerAccessError
from model_contract.promotion_history import LedgerReader as LedgerReader
from model_contract.promotion_history import access as _access
from model_contract.promotion_history import champion_stack as champion_stack
from model_contract.promotion_history import decision_of as _decision
from model_contract.promotion_history import history_table as history_table
from model_contract.promotion_history import metadata as _metadata

APPROVE, REJECT = "Approve", "Reject"  # the approval task's options (dags/approve_fraud_model.py)
# Columns added since the table was first created: `create` adds them to an older table (an ADD COLUMN,
# which the append-only triggers do not forbid: no row changes).
_ADDED_COLUMNS = ("triggered_by", "decided_by", "comment", "inputs_change")

_SQLITE_TRIGGERS = [
    f"CREATE TRIGGER IF NOT EXISTS {TABLE}_no_update BEFORE UPDATE ON {TABLE} "
    "BEGIN SELECT RAISE(ABORT, 'promotion_history is append-only'); END",
    f"CREATE TRIGGER IF NOT EXISTS {TABLE}_no_delete BEFORE DELETE ON {TABLE} "
    "BEGIN SELECT RAISE(ABORT, 'promotion_history is append-only'); END",
]
_POSTGRES_TRIGGERS = [
    f"""CREATE OR REPLACE FUNCTION {TABLE}_append_only() RETURNS trigger AS $$
    BEGIN RAISE EXCEPTION 'promotion_history is append-only'; END; $$ LANGUAGE plpgsql""",
    f"DROP TRIGGER IF EXISTS {TABLE}_no_change ON {TABLE}",
    f"CREATE TRIGGER {TABLE}_no_change BEFORE UPDATE OR DELETE OR TRUNCATE ON {TABLE} "
    f"FOR EACH STATEMENT EXECUTE FUNCTION {TABLE}_append_only()",
]


class Ledger:
    def __init__(self, url: str) -> None:
        self.url = url
        # A waiting candidate blocks on the lock for as long as the other one takes to decide.
        connect_args = {"timeout": 600} if url.startswith("sqlite") else {}
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool, connect_args=connect_args)
        self.dialect = self.engine.dialect.name
        if self.dialect == "sqlite":
            # BEGIN IMMEDIATE needs pysqlite's implicit transactions out of the way.
            sa.event.listen(self.engine, "connect", _sqlite_autocommit_off)
            sa.event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))

    def create(self) -> None:
        """Create the table and its append-only triggers (idempotent). On PostgreSQL nothing is run when both
        are in place, so a login that may append to the table but does not own it (the promoter's) works, and
        one that may not is refused at its first read or append (LedgerAccessError), not at a DDL."""
        with _access(self.engine, "create"):
            if self.dialect == "postgresql" and self._in_place():
                return
            self._create()

    def _in_place(self) -> bool:
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(TABLE):
                return False
            present = {c["name"] for c in sa.inspect(conn).get_columns(TABLE)}
            found = "SELECT 1 FROM pg_trigger WHERE tgname = :name AND tgrelid = CAST(:table AS regclass)"
            trigger = conn.execute(sa.text(found), {"name": f"{TABLE}_no_change", "table": TABLE}).first()
        return set(_ADDED_COLUMNS) <= present and trigger is not None

    def _create(self) -> None:
        with self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _lock_key("create")})
            _metadata.create_all(conn)
            present = {c["name"] for c in sa.inspect(conn).get_columns(TABLE)}
            for name in _ADDED_COLUMNS:
                if name not in present:
                    column = history_table.c[name]
                    kind = column.type.compile(dialect=conn.dialect)
                    conn.exec_driver_sql(f"ALTER TABLE {TABLE} ADD COLUMN {name} {kind}")
            for statement in _SQLITE_TRIGGERS if self.dialect == "sqlite" else _POSTGRES_TRIGGERS:
                conn.exec_driver_sql(statement)

    @contextmanager
    def exclusive(self, model_name: str) -> Iterator[sa.Connection]:
        """One decision at a time per model: everything inside runs under the lock, in a transaction that
        commits when the block finishes (or earlier, with `commit`); a block that fails rolls back what it
        appended since the last commit."""
        self.create()
        # NullPool: closing the connection ends the database session, and with it PostgreSQL's lock.
        with _access(self.engine, "write"), self.engine.connect() as conn:
            conn.begin()  # SQLite: BEGIN IMMEDIATE, the write lock
            if self.dialect == "postgresql":
                # A session lock, not a transaction one, so that it outlives `commit`.
                conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": _lock_key(model_name)})
            try:
                yield conn
            except BaseException:
                conn.rollback()
                raise
            conn.commit()

    def commit(self, conn: sa.Connection) -> None:
        """Make what the `exclusive` block appended so far durable, and go on under the lock. PostgreSQL
        holds its session lock throughout. SQLite's lock is the write transaction itself: it is let go and
        taken again at once, so another writer waiting for it may run in between, and what follows a
        commit must read the state again rather than trust what it read before."""
        conn.commit()
        conn.begin()

    def append(self, conn: sa.Connection, decision: Decision) -> Decision:
        row = decision.to_dict()
        row.pop("id")
        row["recorded_at"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        row["candidate_metrics"] = json.dumps(decision.candidate_metrics, sort_keys=True)
        row["champion_metrics"] = json.dumps(decision.champion_metrics, sort_keys=True)
        row["inputs_change"] = json.dumps(decision.inputs_change) if decision.inputs_change else None
        primary_key = conn.execute(history_table.insert().values(**row)).inserted_primary_key
        assert primary_key is not None, "a single-row INSERT reports its primary key"
        new_id = primary_key[0]
        return Decision(**{**decision.to_dict(), "recorded_at": row["recorded_at"], "id": new_id})

    def history(self, model_name: str, conn: sa.Connection | None = None) -> list[Decision]:
        query = (
            sa.select(history_table)
            .where(history_table.c.model_name == model_name)
            .order_by(history_table.c.id)
        )
        if conn is None:
            self.create()
            with _access(self.engine, "read"), self.engine.connect() as own:
                rows = own.execute(query).mappings().all()
        else:
            rows = conn.execute(query).mappings().all()
        return [_decision(row) for row in rows]

    def dispose(self) -> None:
        self.engine.dispose()


def _lock_key(name: str) -> int:
    # pg advisory locks take a signed 64-bit key; a stable hash of the name (not Python's hash()).
    return zlib.crc32(f"mlops-promotion:{name}".encode())


def _sqlite_autocommit_off(dbapi_connection, _record) -> None:
    dbapi_connection.isolation_level = None


def pending_approval(history: list[Decision], version: str) -> Decision | None:
    """The gate row of `version` waiting for a person, if no approval decision about it followed."""
    waiting = None
    for row in history:
        if row.candidate_version != version:
            continue
        if row.action == "gate" and row.decision == "awaiting_approval":
            waiting = row
        elif row.action == "approval" and row.decision in ("promoted", "rejected"):
            waiting = None
    return waiting
