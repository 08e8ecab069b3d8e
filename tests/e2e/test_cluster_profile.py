"""The whole chain in the cluster profile, on this machine's real services: `mlops demo` with
MLOPS_PROFILE=cluster starts the stack (scripts/up.sh) with Airflow's metadata on PostgreSQL (LocalExecutor,
tasks in parallel), an MLflow tracking server on a PostgreSQL database of its own, the Feast online store on
Redis, and the Spark the cluster deploys: infra/k8s/base/spark's Master, Workers and Spark Connect server,
each started on loopback with its container's own command and settings, with the Airflow pods' Spark
settings from infra/helm/airflow/values.yaml (tests/e2e/chart_spark.py); training runs as a local process
(MLOPS_TRAINING__RUNNER=local: no Kubernetes here).
The stack is stopped at the end (`--down`); then every backend is read back directly: Airflow's runs and task
instances in PostgreSQL, the registry and the champion alias in MLflow's database, the feature rows in Redis,
the Spark application in the Master's status.

Each run gets its own PostgreSQL databases and Redis database index, removed or emptied afterwards.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipelines.spark import CONNECT_APP_NAME
from tests.conftest import free_port, spark_standalone_status
from tests.e2e.chart_spark import chart_spark
from tests.e2e.conftest import logs, run_script, stack_env

POSTGRES = "postgresql://postgres@127.0.0.1:5432"
# SQLAlchemy engines name the driver we install (its default for postgresql:// is another one).
ENGINE = "postgresql+psycopg2://postgres@127.0.0.1:5432"
REDIS = "redis://127.0.0.1:6379"
REDIS_DB = 11  # this test's database index; emptied of the chain's keys afterwards
# Two days: the first one's retrain skips (no label is a day old yet), the second trains and gates the first
# champion. Challengers against a champion are the local e2e stack's business (tests/e2e/test_demo.py).
ARGS = ("--days", "2", "--rows-per-day", "1500", "--epochs", "3", "--no-drift-drill")
DATES = ["2026-01-01", "2026-01-02"]
TIMEOUT = 2400
INGEST, FEATURES, RETRAIN = "ingest_transactions", "build_features", "retrain_fraud_model"

pytestmark = pytest.mark.timeout(TIMEOUT + 300)


def _admin():
    import sqlalchemy as sa

    return sa.create_engine(f"{ENGINE}/postgres", isolation_level="AUTOCOMMIT")


@pytest.fixture
def databases():
    """Two fresh PostgreSQL databases: Airflow's metadata + the promotion history, and MLflow's (both keep
    an alembic_version table, so they cannot share one)."""
    base = f"mlops_chain_{uuid.uuid4().hex[:8]}"
    names = {"airflow": base, "mlflow": f"{base}_mlflow"}
    admin = _admin()
    with admin.connect() as conn:
        for name in names.values():
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield names
    with admin.connect() as conn:
        for name in names.values():
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture
def redis_db():
    import redis

    client = redis.Redis.from_url(f"{REDIS}/{REDIS_DB}")
    if client.dbsize():
        pytest.fail(f"Redis database {REDIS_DB} is not empty; this test needs it to itself")
    yield client
    client.flushdb()
    client.close()


def _query(database: str, sql: str) -> list[tuple]:
    import sqlalchemy as sa

    engine = sa.create_engine(f"{ENGINE}/{database}")
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.exec_driver_sql(sql)]
    finally:
        engine.dispose()


def test_the_chain_runs_in_the_cluster_profile_on_postgres_redis_and_the_charts_spark_cluster(
    databases, redis_db, tmp_path: Path
):
    home = tmp_path / "home"
    jit = {"MLOPS_SPARK_JAVA_OPTIONS": stack_env(home)["MLOPS_SPARK_JAVA_OPTIONS"]}
    with chart_spark(tmp_path / "spark", home, jit) as spark:
        _the_chain_on(spark, jit, home, databases, redis_db, tmp_path)


def _the_chain_on(spark, jit: dict[str, str], home: Path, databases, redis_db, tmp_path: Path) -> None:
    mlflow_port = free_port()
    # The cluster's pseudonym key is a mounted Secret the profile requires (it never makes one): a file here.
    key_file = tmp_path / "pseudonym-key" / "key"
    key_file.parent.mkdir()
    key_file.write_text(secrets.token_hex(32) + "\n")
    env = stack_env(
        home,
        MLOPS_PROFILE="cluster",
        MLOPS_PRIVACY__KEY_FILE=str(key_file),
        MLOPS_CLUSTER__POSTGRES_DSN=f"{POSTGRES}/{databases['airflow']}",
        MLOPS_MLFLOW_BACKEND_STORE_URI=f"{ENGINE}/{databases['mlflow']}",
        MLOPS_CLUSTER__MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow_port}",
        MLOPS_CLUSTER__REDIS_URL=f"{REDIS}/{REDIS_DB}",
        # The Airflow pods' Spark settings (their Connect server and master, here on loopback), then the
        # stacks' JIT option (chart_spark).
        **{**spark.settings, **jit},
        MLOPS_TRAINING__RUNNER="local",
        MLOPS_TRAINING__LABEL_MATURITY_DAYS="1",
        MLOPS_GATE__FLOOR="0",
        MLOPS_AIRFLOW_PORT=str(free_port()),
        MLOPS_UP_TIMEOUT="300",
        AIRFLOW__CORE__PARALLELISM="4",
    )
    mlops = str(Path(sys.executable).with_name("mlops"))
    started = time.monotonic()
    try:
        done = subprocess.run(
            [mlops, "demo", *ARGS, "--timeout", str(TIMEOUT - 300), "--down", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
    finally:
        down = run_script("down.sh", env, timeout=180)  # a no-op after --down; stops what a failure left
    print(f"\nmlops demo {' '.join(ARGS)} in the cluster profile: {time.monotonic() - started:.0f}s")
    assert done.returncode == 0, f"{done.stderr[-6000:]}\n{logs(home)}"
    assert down.returncode == 0 and down.stdout.startswith("down: nothing to stop"), down.stdout
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["stack"] == "stopped" and summary["dates"] == DATES
    trained = [r for r in summary["retrains"] if r["decision"] != "skipped"]
    assert [r["as_of"] for r in trained] == DATES[1:]
    assert [r["model_version"] for r in trained] == ["1"]
    assert trained[0]["decision"] == "promoted" and summary["champion_version"] == "1"

    # Airflow's metadata is in PostgreSQL: every run of the chain succeeded there.
    runs = dict(
        _query(
            databases["airflow"],
            "SELECT dag_id, count(*) FROM dag_run WHERE state = 'success' GROUP BY dag_id",
        )
    )
    assert runs[INGEST] == 2 and runs[FEATURES] >= 2 and runs[RETRAIN] >= 2, runs
    failed = _query(
        databases["airflow"],
        "SELECT dag_id, task_id, state FROM task_instance WHERE state IN ('failed', 'upstream_failed')",
    )
    assert failed == []
    # The LocalExecutor ran tasks in parallel: an ingest run's labels task overlapped its bronze/silver path.
    overlaps = _query(
        databases["airflow"],
        """SELECT count(*) FROM task_instance l JOIN task_instance b USING (dag_id, run_id)
           WHERE l.dag_id = 'ingest_transactions' AND l.task_id = 'ingest_labels'
             AND b.task_id IN ('ingest_to_bronze', 'validate_bronze', 'build_silver', 'validate_silver')
             AND l.start_date < b.end_date AND b.start_date < l.end_date""",
    )[0][0]
    assert overlaps >= 1
    # The promotion history lives beside Airflow's tables in the profile's PostgreSQL database.
    history = _query(databases["airflow"], "SELECT count(*) FROM promotion_history")[0][0]
    assert history == len(trained)

    # MLflow's tracking server kept the registry in its own PostgreSQL database.
    versions = _query(databases["mlflow"], "SELECT version FROM model_versions WHERE name = 'fraud-detector'")
    assert [v for (v,) in versions] == [1]
    aliases = _query(
        databases["mlflow"],
        "SELECT alias, version FROM registered_model_aliases WHERE name = 'fraud-detector'",
    )
    assert aliases == [("champion", int(summary["champion_version"]))]

    # Feast's online store is Redis: one hash per customer and merchant entity of the project.
    assert summary["rows_materialized"] > 0
    assert sum(1 for _ in redis_db.scan_iter(count=1000)) > 0

    # Spark ran on the chart's cluster: its Connect server, the one application of the Master, the stack's
    # tasks its clients (the stack started no Spark of its own), on every Worker the manifest deploys.
    status = spark_standalone_status(spark.master)
    apps = [a for a in status["activeapps"] + status["completedapps"]]
    assert [(a["name"], a["state"]) for a in apps] == [(CONNECT_APP_NAME, "RUNNING")], apps
    assert len(status["workers"]) == spark.workers and all(w["state"] == "ALIVE" for w in status["workers"])
    assert all(w["coresused"] > 0 for w in status["workers"]), status["workers"]  # executors on each
