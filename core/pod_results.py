"""A pod task's result, from the pod to the Airflow task that launched it, through the database both reach
(the cluster's PostgreSQL, where the promotion history lives; SQLite under $MLOPS_HOME locally).

The provider's own way is a sidecar that holds /airflow/xcom/return.json until the worker reads it by exec.
That needs `pods/exec` in the training namespace (a shell in any pod there), pulls the sidecar's image from
a public registry, and in deferrable mode can lose the result (apache/airflow#72821). A termination message
needs nothing but `get pods`, but is capped at 4 KiB, less than a week's monitoring checks. Here the pod
knows its own name (the downward API: POD_NAME_ENV) and namespace (its settings', which are its launcher's),
and the operator knows the pod it followed, so that pair is the key: a retry's new pod has a new name, and a
retry that reattaches to the running pod reads that pod's result. The operator deletes the row once the
result is in XCom.
"""

from __future__ import annotations

import functools
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import sqlalchemy as sa

# What the pod's environment holds (the downward API, orchestration/k8s_contract.py): its own name. This
# module is imported where pods are described, so SQLAlchemy is imported only to read and write.
POD_NAME_ENV = "MLOPS_POD_NAME"
TABLE = "pod_results"


class PodResultMissingError(RuntimeError):
    """The pod finished but left no result: the message names the pod and where the result was looked for."""


@functools.cache
def _table() -> sa.Table:
    import sqlalchemy as sa

    return sa.Table(
        TABLE,
        sa.MetaData(),
        sa.Column("namespace", sa.String(253), primary_key=True),
        sa.Column("pod", sa.String(253), primary_key=True),
        sa.Column("result", sa.Text, nullable=False),  # JSON
        sa.Column("written_at", sa.String(40), nullable=False),
    )


@functools.cache
def _engine(url: str) -> sa.Engine:
    """One engine a database for the process (no pool: a pod writes once, a task reads once), the table
    made on first use rather than on every read and write."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    _table().metadata.create_all(engine)
    return engine


def _key(namespace: str, pod: str) -> sa.ColumnElement[bool]:
    table = _table()
    return (table.c.namespace == namespace) & (table.c.pod == pod)


def write(url: str, namespace: str, pod: str, result: dict[str, Any]) -> None:
    """Record the result of `namespace`/`pod` (again: the last write wins)."""
    import sqlalchemy as sa

    with _engine(url).begin() as connection:
        connection.execute(sa.delete(_table()).where(_key(namespace, pod)))
        connection.execute(
            sa.insert(_table()).values(
                namespace=namespace,
                pod=pod,
                result=json.dumps(result, sort_keys=True, default=str),
                written_at=datetime.now(UTC).isoformat(),
            )
        )


def read(url: str, namespace: str, pod: str) -> dict[str, Any]:
    """The result `namespace`/`pod` recorded; PodResultMissingError if it recorded none."""
    import sqlalchemy as sa

    with _engine(url).connect() as connection:
        row = connection.execute(sa.select(_table().c.result).where(_key(namespace, pod))).first()
    if row is None:
        raise PodResultMissingError(
            f"pod {namespace}/{pod} finished without recording its result in the {TABLE} table of "
            f"{sa.make_url(url).render_as_string(hide_password=True)}; its log (the task's log) says why"
        )
    return json.loads(row.result)


def forget(url: str, namespace: str, pod: str) -> None:
    """Delete the row of `namespace`/`pod` (its result is in XCom now)."""
    import sqlalchemy as sa

    with _engine(url).begin() as connection:
        connection.execute(sa.delete(_table()).where(_key(namespace, pod)))


def emit(result: dict[str, Any], xcom_path: Path | None = None, *, record: bool = True) -> None:
    """A command's result: one JSON line on stdout (the last), written to `xcom_path` if given, and, in a pod
    (POD_NAME_ENV set by the downward API) with `record`, into the pod results table under the pod's name and
    the settings' namespace, which the launching task reads. A result that cannot be recorded fails the
    command (and the pod, and the task's try)."""
    from core import lineage

    held = lineage.take_held()  # the pod's lineage events, for its launcher to send (core/lineage.py)
    if held and record and os.environ.get(POD_NAME_ENV):
        result = {**result, lineage.RELAY_KEY: held}
    line = json.dumps(result, sort_keys=True, default=str)
    if xcom_path is not None:
        xcom_path.parent.mkdir(parents=True, exist_ok=True)
        xcom_path.write_text(line)
    pod = os.environ.get(POD_NAME_ENV)
    if record and pod:
        from core.settings import get_settings

        settings = get_settings()
        write(settings.promotion_ledger_url, settings.cluster.kubernetes_namespace, pod, result)
    print(line, flush=True)
