"""The monitoring results table: one row per check and input, what a UI lists and the rollback rule reads.

A SQL table beside the promotion history: SQLite at `$MLOPS_HOME/monitoring/monitoring.db` in the local
profile, the cluster's PostgreSQL otherwise, since the cluster runs the check in a pod that mounts the
shared volume read-only (and several readers on a shared filesystem are what SQLite is bad at).

Rows of one check share `check_id`; `kind` says what a row holds:
- `numeric` | `categorical` | `score`: one input's drift (psi, ks, drifted, rows, null shares);
- `performance`: one model version's live figures (`role` served or shadow; auc_pr, recall, frauds);
- `check`: the verdict of the check, its reason and any rollback (`note`).
A check rerun by the same Airflow run (a retry, a cleared task) replaces the rows it wrote for that date.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import date
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from core.settings import Profile

if TYPE_CHECKING:
    import pandas as pd

    from core.settings import Settings

TABLE = "monitoring_results"

_metadata = sa.MetaData()
results_table = sa.Table(
    TABLE,
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("check_id", sa.String(64), nullable=False, index=True),
    sa.Column("recorded_at", sa.String(40), nullable=False),
    sa.Column("day", sa.String(10), nullable=False, index=True),  # the checked date, YYYY-MM-DD
    sa.Column("model_name", sa.String(200), nullable=False),
    sa.Column("champion_version", sa.String(20)),  # the champion when the check ran
    sa.Column("feature_source", sa.String(20)),  # scoring_log | lake
    sa.Column(
        "kind", sa.String(20), nullable=False
    ),  # numeric | categorical | score | performance | service | check
    sa.Column("name", sa.String(200), nullable=False),  # the input, the role, or "verdict"
    sa.Column("model_version", sa.String(20)),  # whose scores (score drift, performance)
    sa.Column("role", sa.String(10)),  # served | shadow (performance)
    sa.Column("psi", sa.Float),
    sa.Column("ks", sa.Float),
    sa.Column("drifted", sa.Boolean),
    sa.Column("rows", sa.Integer),
    sa.Column("reference_rows", sa.Integer),
    sa.Column("null_share", sa.Float),
    sa.Column("reference_null_share", sa.Float),
    sa.Column("auc_pr", sa.Float),
    sa.Column("recall_at_1pct_fpr", sa.Float),
    sa.Column("labelled_frauds", sa.Integer),
    sa.Column("sufficient", sa.Boolean),
    sa.Column("verdict", sa.String(20)),  # drift | no_drift | insufficient (kind check)
    sa.Column("note", sa.Text),
    sa.Column("dag_id", sa.String(250)),
    sa.Column("dag_run_id", sa.String(250)),
    sa.Column("mlflow_run_id", sa.String(64)),
)
COLUMNS = tuple(c.name for c in results_table.columns)


def results_url(settings: Settings) -> str:
    if settings.profile is Profile.LOCAL:
        return f"sqlite:///{settings.monitoring_dir / 'monitoring.db'}"
    return settings.cluster.postgres_dsn.replace("postgresql://", "postgresql+psycopg2://", 1)


def _engine(settings: Settings) -> sa.Engine:
    if settings.profile is Profile.LOCAL:
        settings.monitoring_dir.mkdir(parents=True, exist_ok=True)
    connect_args = {"timeout": 60} if settings.profile is Profile.LOCAL else {}
    engine = sa.create_engine(results_url(settings), poolclass=sa.pool.NullPool, connect_args=connect_args)
    _metadata.create_all(engine)
    return engine


def append_results(settings: Settings, rows: Sequence[dict[str, Any]]) -> int:
    """Append one check's rows (all of one `day`); rows of the same day that the same Airflow run wrote
    before (`dag_run_id`, when given) are replaced. Returns the rows written."""
    if not rows:
        return 0
    unknown = set().union(*rows) - set(COLUMNS)
    if unknown:
        raise ValueError(f"{TABLE} has no columns {sorted(unknown)}")
    engine = _engine(settings)
    try:
        with engine.begin() as conn:
            first = rows[0]
            if first.get("dag_run_id"):
                conn.execute(
                    results_table.delete().where(
                        (results_table.c.day == first["day"])
                        & (results_table.c.dag_id == first.get("dag_id"))
                        & (results_table.c.dag_run_id == first["dag_run_id"])
                    )
                )
            # Every row with every column: an executemany takes its columns from the first row.
            filled = [{c: row.get(c) for c in COLUMNS if c != "id"} for row in rows]
            conn.execute(results_table.insert(), filled)
    finally:
        engine.dispose()
    return len(rows)


def read_results(
    settings: Settings,
    first: date | None = None,
    last: date | None = None,
    kinds: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The results table's rows (of checked days first .. last, of `kinds`), oldest first, as a DataFrame
    with COLUMNS (empty when nothing was checked yet)."""
    import pandas as pd

    query = sa.select(results_table).order_by(results_table.c.id)
    if first is not None:
        query = query.where(results_table.c.day >= first.isoformat())
    if last is not None:
        query = query.where(results_table.c.day <= last.isoformat())
    if kinds is not None:
        query = query.where(results_table.c.kind.in_(list(kinds)))
    engine = _engine(settings)
    try:
        with engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
    finally:
        engine.dispose()
    return pd.DataFrame([dict(r) for r in rows], columns=list(COLUMNS))
