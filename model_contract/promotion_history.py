"""The promotion history's contract: its table, its rows, and how the champion is read from it. Training
writes it (training/ledger.py: the append-only table, the lock, the gate's and people's decisions); the
scoring service reads it here and serves the champion it records rather than whatever MLflow's alias names
(serving/models.py), with a login that may only read (LedgerReader).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Protocol

import sqlalchemy as sa

from core.errors import PipelineError

TABLE = "promotion_history"

metadata = sa.MetaData()
history_table = sa.Table(
    TABLE,
    metadata,
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


class LedgerAccessError(PipelineError):
    """The database login may not read or write the promotion history: the message names it."""


# PostgreSQL's SQLSTATE for a privilege the role lacks (permission denied, must be owner).
_INSUFFICIENT_PRIVILEGE = "42501"


@contextmanager
def access(engine: sa.Engine, what: str) -> Iterator[None]:
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


def decision_of(row) -> Decision:
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
        # One connection kept for the reads every few seconds (checked before use: a restarted database is
        # reconnected), not one opened per read.
        self.engine = sa.create_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)

    def champion(self, model_name: str) -> tuple[str | None, int | None]:
        """The champion the history replays and the id of the last row that moved it; (None, None) before
        any promotion, or when the history was never created."""
        if self.engine.dialect.name == "sqlite":
            path = self.engine.url.database
            if path and path != ":memory:" and not os.path.exists(path):
                return None, None  # connecting would create the file
        columns = history_table.c
        # only what the replay reads, not each row's metrics
        query = (
            sa.select(columns.id, columns.decision, columns.champion_after)
            .where(history_table.c.model_name == model_name)
            .where(history_table.c.decision.in_(("promoted", "rolled_back")))
            .order_by(history_table.c.id)
        )
        with access(self.engine, "read"), self.engine.connect() as conn:
            if not sa.inspect(conn).has_table(TABLE):
                return None, None
            moves = conn.execute(query).all()
        stack = champion_stack(moves)
        return (stack[-1] if stack else None), (moves[-1].id if moves else None)

    def dispose(self) -> None:
        self.engine.dispose()


class Move(Protocol):
    """What the replay reads of a row: a Decision, or a row of just these columns."""

    @property
    def decision(self) -> str: ...

    @property
    def champion_after(self) -> str | None: ...


def champion_stack(history: Sequence[Move]) -> list[str]:
    """Replay the history: a promotion pushes its version, a rollback pops the current champion.
    The last element is the champion; the one before it is what a rollback restores."""
    stack: list[str] = []
    for decision in history:
        if decision.decision == "promoted" and decision.champion_after:
            stack.append(decision.champion_after)
        elif decision.decision == "rolled_back" and stack:
            stack.pop()
    return stack
