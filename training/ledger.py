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
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import sqlalchemy as sa

from core.errors import PipelineError

TABLE = "promotion_history"
APPROVE, REJECT = "Approve", "Reject"  # the approval task's options (dags/approve_fraud_model.py)

_metadata = sa.MetaData()
history_table = sa.Table(
    TABLE,
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.Column("model_name", sa.String(200), nullable=False, index=True),
    sa.Column("action", sa.String(20), nullable=False),  # gate | manual | rollback | approval
    # promoted | rejected | rolled_back | awaiting_approval (a gate pass waiting for a person) | refused (a
    # compare-and-swap that found another champion, or an approval by the person who started the run)
    sa.Column("decision", sa.String(20), nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("candidate_version", sa.String(20)),
    sa.Column("champion_before", sa.String(20)),
    sa.Column("champion_after", sa.String(20)),
    sa.Column("candidate_metrics", sa.Text, nullable=False),  # JSON
    sa.Column("champion_metrics", sa.Text, nullable=False),  # JSON
    sa.Column("training_set_rev", sa.String(64)),
    sa.Column("dag_id", sa.String(250)),
    sa.Column("run_id", sa.String(250)),
    # Human approval (training/registry.py decide_approval): who started the run that asked, who decided
    # (an approver, or the person a refusal names), and what they wrote.
    sa.Column("triggered_by", sa.String(250)),
    sa.Column("decided_by", sa.String(250)),
    sa.Column("comment", sa.Text),
    # A gate decision across a change of inputs: the input names the candidate adds to and removes from the
    # champion's (JSON {"added": [...], "removed": [...]}); NULL when both take the same inputs.
    sa.Column("inputs_change", sa.Text),
)
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


@dataclass(frozen=True)
class Decision:
    """One row of the history."""

    model_name: str
    action: str
    decision: str
    reason: str
    candidate_version: str | None
    champion_before: str | None
    champion_after: str | None
    candidate_metrics: dict = field(default_factory=dict)
    champion_metrics: dict = field(default_factory=dict)
    training_set_rev: str | None = None
    dag_id: str | None = None
    run_id: str | None = None
    triggered_by: str | None = None
    decided_by: str | None = None
    comment: str | None = None
    inputs_change: dict | None = None  # {"added": [...], "removed": [...]} when the inputs differ
    recorded_at: str = ""
    id: int | None = None

    @property
    def promoted(self) -> bool:
        return self.decision == "promoted"

    def to_dict(self) -> dict:
        return asdict(self)


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


class LedgerAccessError(PipelineError):
    """The database login may not read or write the promotion history: the message names it."""


# PostgreSQL's SQLSTATE for a privilege the role lacks (permission denied, must be owner).
_INSUFFICIENT_PRIVILEGE = "42501"


@contextmanager
def _access(engine: sa.Engine, what: str) -> Iterator[None]:
    """A refusal by the database for want of a privilege, said as what it means: this login is not the one
    that moves the champion (separated duties, infra/README.md)."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        if getattr(exc.orig, "pgcode", None) != _INSUFFICIENT_PRIVILEGE:
            raise
        login = engine.url.username or "this login"
        raise LedgerAccessError(
            f"the database login {login!r} may not {what} the promotion history ({TABLE}): "
            f"{str(exc.orig).strip().splitlines()[0]}. Promotions, approvals and rollbacks run with the "
            "promoter's login (the Secret MLOPS_TRAINING__PROMOTION_CREDENTIALS_SECRET names); training, "
            "evaluation and export run with one that cannot move the champion, by design"
        ) from exc


def _decision(row) -> Decision:
    return Decision(
        **{
            **row,
            "candidate_metrics": json.loads(row["candidate_metrics"]),
            "champion_metrics": json.loads(row["champion_metrics"]),
            "inputs_change": json.loads(row["inputs_change"]) if row["inputs_change"] else None,
        }
    )


class LedgerReader:
    """The history read, never written: what the scoring service asks before it serves a version (it
    serves the champion the history replays, not whatever MLflow's alias names). It creates nothing, takes
    no lock (SQLite: no BEGIN IMMEDIATE; PostgreSQL: a role with SELECT on the table is enough,
    infra/README.md) and reads only the rows that move the champion."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = sa.create_engine(url, poolclass=sa.pool.NullPool)

    def champion(self, model_name: str) -> tuple[str | None, int | None]:
        """The champion the history replays and the id of the last row that moved it; (None, None) before
        any promotion, or when the history was never created."""
        if self.engine.dialect.name == "sqlite":
            path = self.engine.url.database
            if path and path != ":memory:" and not os.path.exists(path):
                return None, None  # connecting would create the file
        query = (
            sa.select(history_table)
            .where(history_table.c.model_name == model_name)
            .where(history_table.c.decision.in_(("promoted", "rolled_back")))
            .order_by(history_table.c.id)
        )
        with _access(self.engine, "read"), self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(TABLE):
                return None, None
            moves = [_decision(row) for row in conn.execute(query).mappings().all()]
        stack = champion_stack(moves)
        return (stack[-1] if stack else None), (moves[-1].id if moves else None)

    def dispose(self) -> None:
        self.engine.dispose()


def champion_stack(history: list[Decision]) -> list[str]:
    """Replay the history: a promotion pushes its version, a rollback pops the current champion.
    The last element is the champion; the one before it is what a rollback restores."""
    stack: list[str] = []
    for decision in history:
        if decision.decision == "promoted" and decision.champion_after:
            stack.append(decision.champion_after)
        elif decision.decision == "rolled_back" and stack:
            stack.pop()
    return stack


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
