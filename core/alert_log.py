"""Repeated alerts, told once a period: the alerts sent, counted by kind, subject and period in the database
every sender reaches (the cluster's PostgreSQL, where the promotion history lives; SQLite under $MLOPS_HOME
locally), so a drift or a label lag that every check finds again reaches people once a period, not once a
check, whichever process or pod found it. The first of a period is sent, and says how many of the period
before were held back; the rest are counted, not sent. A database that cannot be reached never holds an
alert back: it is sent, and the failure logged.
"""

from __future__ import annotations

import functools
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import sqlalchemy as sa

log = logging.getLogger(__name__)

TABLE = "alerts_sent"
SUBJECT_KEY = 250  # characters of a subject that tell two alerts apart


@functools.cache
def _table() -> sa.Table:
    import sqlalchemy as sa

    return sa.Table(
        TABLE,
        sa.MetaData(),
        sa.Column("kind", sa.String(40), primary_key=True),
        sa.Column("subject", sa.String(SUBJECT_KEY), primary_key=True),
        sa.Column("period", sa.BigInteger, primary_key=True),  # the period's number since the epoch
        sa.Column("count", sa.Integer, nullable=False),
        sa.Column("first_at", sa.String(40), nullable=False),
        sa.Column("last_at", sa.String(40), nullable=False),
    )


@functools.cache
def _engine(url: str) -> sa.Engine:
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    _table().metadata.create_all(engine)
    return engine


def claim(url: str, kind: str, subject: str, period_s: int, now: float | None = None) -> tuple[int, int]:
    """Count this alert in its period: (its number in the period, starting at 1; how many of the same kind
    and subject the period before counted). Raises what the database raises."""
    import sqlalchemy as sa

    table, key = _table(), subject[:SUBJECT_KEY]
    moment = time.time() if now is None else now
    period = int(moment // period_s)
    stamp = datetime.fromtimestamp(moment, UTC).isoformat(timespec="seconds")
    same = (table.c.kind == kind) & (table.c.subject == key)
    with _engine(url).begin() as connection:
        updated = connection.execute(
            sa.update(table)
            .where(same & (table.c.period == period))
            .values(count=table.c.count + 1, last_at=stamp)
        )
        if updated.rowcount == 0:
            try:
                with connection.begin_nested():
                    connection.execute(
                        sa.insert(table).values(
                            kind=kind, subject=key, period=period, count=1, first_at=stamp, last_at=stamp
                        )
                    )
            except sa.exc.IntegrityError:  # another sender's first of the period came between
                connection.execute(
                    sa.update(table)
                    .where(same & (table.c.period == period))
                    .values(count=table.c.count + 1, last_at=stamp)
                )
        count = connection.execute(
            sa.select(table.c.count).where(same & (table.c.period == period))
        ).scalar_one()
        before = connection.execute(
            sa.select(table.c.count).where(same & (table.c.period == period - 1))
        ).scalar()
    return int(count), int(before or 0)
