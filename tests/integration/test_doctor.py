"""`mlops doctor` reports truthfully on this machine: real Java, a real Spark job, real services."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.buckets import bucket_endpoint
from tests.integration.conftest import migrated_airflow_db

MLOPS = Path(sys.executable).with_name("mlops")


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe closes


def _doctor(tmp_path, **env) -> tuple[int, dict]:
    environment = {**os.environ, "MLOPS_HOME": str(tmp_path / "home"), **env}
    out = subprocess.run(
        [str(MLOPS), "doctor", "--json"], capture_output=True, text=True, env=environment, timeout=300
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    return out.returncode, report


def _by_name(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_local_profile_is_healthy_here_and_spark_really_runs(tmp_path):
    code, report = _doctor(tmp_path)
    checks = _by_name(report)
    assert code == 0, report
    assert report["profile"] == "local" and report["failed"] == []
    assert checks["java"]["status"] == "ok" and "Java 17" in checks["java"]["detail"]
    assert checks["spark"]["status"] == "ok" and "ran a job" in checks["spark"]["detail"]
    assert not (tmp_path / "home").exists()  # the doctor looks, it does not create


def test_missing_java_is_named_with_a_fix(tmp_path):
    code, report = _doctor(tmp_path, JAVA_HOME=str(tmp_path / "no-jdk"))
    java = _by_name(report)["java"]
    assert code == 1 and "java" in report["failed"]
    assert "no-jdk" in java["detail"] and "has no bin/java" in java["detail"]
    assert "JDK 17" in java["fix"]


def test_cluster_profile_checks_the_real_services_and_names_what_is_down(tmp_path):
    spark_port, mlflow_port = _closed_port(), _closed_port()
    code, report = _doctor(
        tmp_path,
        MLOPS_PROFILE="cluster",
        MLOPS_CLUSTER__POSTGRES_DSN="postgresql://postgres@127.0.0.1:5432/postgres",
        MLOPS_CLUSTER__REDIS_URL="redis://127.0.0.1:6379/0",
        MLOPS_CLUSTER__SPARK_MASTER=f"spark://127.0.0.1:{spark_port}",
        MLOPS_CLUSTER__MLFLOW_TRACKING_URI=f"http://127.0.0.1:{mlflow_port}",
    )
    checks = _by_name(report)
    assert checks["postgres"]["status"] == "ok" and "PostgreSQL" in checks["postgres"]["detail"]
    assert checks["redis"]["status"] == "ok" and "Redis" in checks["redis"]["detail"]
    assert checks["spark"]["status"] == "fail" and str(spark_port) in checks["spark"]["detail"]
    assert checks["mlflow"]["status"] == "fail" and str(mlflow_port) in checks["mlflow"]["detail"]
    assert checks["mlflow"]["fix"] and checks["spark"]["fix"]
    assert code == 1 and set(report["failed"]) == {"spark", "mlflow"}


def test_a_wrong_redis_address_is_reported_not_hidden(tmp_path):
    port = _closed_port()
    _, report = _doctor(
        tmp_path, MLOPS_PROFILE="cluster", MLOPS_CLUSTER__REDIS_URL=f"redis://127.0.0.1:{port}/0"
    )
    redis = _by_name(report)["redis"]
    assert redis["status"] == "fail" and str(port) in redis["detail"]
    assert "MLOPS_CLUSTER__REDIS_URL" in redis["fix"]


def test_a_spark_connect_server_that_is_not_there_is_named_with_a_fix(tmp_path):
    port = _closed_port()
    code, report = _doctor(tmp_path, MLOPS_SPARK_REMOTE=f"sc://127.0.0.1:{port}")
    spark = _by_name(report)["spark"]
    assert code == 1 and spark["status"] == "fail"
    assert f"sc://127.0.0.1:{port}" in spark["detail"] and "MLOPS_SPARK_REMOTE" in spark["fix"]


def test_local_profile_names_every_store_and_where_it_is(tmp_path):
    _, report = _doctor(tmp_path, MLOPS_SPARK_REMOTE=f"sc://127.0.0.1:{_closed_port()}")
    residency = _by_name(report)["residency"]
    assert residency["status"] == "ok", residency
    for store in ("landing", "DVC remote", "MLflow backend and registry", "MLflow artifacts"):
        assert f"{store}: local " in residency["detail"]


def _cluster(tmp_path, **env) -> dict:
    """The doctor's residency check in the cluster profile, Spark's master on a closed port (no JVM)."""
    _, report = _doctor(
        tmp_path,
        MLOPS_PROFILE="cluster",
        MLOPS_CLUSTER__SPARK_MASTER=f"spark://127.0.0.1:{_closed_port()}",
        MLOPS_CLUSTER__MLFLOW_TRACKING_URI=f"http://127.0.0.1:{_closed_port()}",
        **env,
    )
    return _by_name(report)["residency"]


@pytest.mark.parametrize(("real", "status"), [("eu-west-1", "ok"), ("us-east-1", "fail")])
def test_the_object_stores_declared_region_is_checked_against_the_stores_own_answer(tmp_path, real, status):
    with bucket_endpoint(403, real) as bucket:
        residency = _cluster(
            tmp_path,
            MLOPS_CLUSTER__OBJECT_STORE_URI="s3://fraud-lake/prod?region=eu-west-1",
            MLOPS_CLUSTER__OBJECT_STORE_ENDPOINT=bucket.url,
        )
    assert bucket.asked == ["/fraud-lake"]
    assert residency["status"] == status, residency
    if status == "ok":
        assert f"object store region eu-west-1 verified at {bucket.url}/fraud-lake" in residency["detail"]
    else:
        assert "declared in eu-west-1" in residency["detail"] and "us-east-1" in residency["detail"]
        assert "?region=" in residency["fix"]


def test_an_object_store_that_cannot_be_reached_is_said_to_be_unverified(tmp_path):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    residency = _cluster(
        tmp_path,
        MLOPS_CLUSTER__OBJECT_STORE_URI="s3://fraud-lake/prod?region=eu-west-1",
        MLOPS_CLUSTER__OBJECT_STORE_ENDPOINT=endpoint,
    )
    assert residency["status"] == "warn", residency
    assert "not verified, only declared" in residency["detail"] and endpoint in residency["detail"]


def test_a_database_or_cache_outside_the_policy_fails_the_check_by_name(tmp_path):
    residency = _cluster(
        tmp_path,
        MLOPS_CLUSTER__REDIS_URL="redis://:s3cr3t@cache.us.example.com:6379/0",
        MLOPS_CLUSTER__POSTGRES_DSN="postgresql://u@db.abc123.us-east-1.rds.amazonaws.com:5432/mlops",
    )
    assert residency["status"] == "fail", residency
    assert "Redis (online store, live entity state)" in residency["detail"]
    assert "endpoint host cache.us.example.com" in residency["detail"]
    assert "PostgreSQL" in residency["detail"] and "region us-east-1" in residency["detail"]
    assert "s3cr3t" not in residency["detail"]
    assert "MLOPS_STORAGE_POLICY__ALLOWED_ENDPOINT_HOSTS" in residency["fix"]


def test_the_doctor_names_the_product_dags_that_are_paused_or_missing_in_airflow(tmp_path):
    """Read from Airflow's own metadata database, after Airflow itself parsed the DAG folder (`airflow dags
    reserialize`, which creates each DAG paused, Airflow's default): every product DAG is named, the demo's
    synthetic feed is not; once unpaused (Airflow's CLI), the check passes."""
    import shutil

    import sqlalchemy as sa

    home = tmp_path / "home"
    (home / "airflow").mkdir(parents=True)
    database = home / "airflow" / "airflow.db"
    _, report = _doctor(tmp_path)
    assert "Airflow has not run here yet" in _by_name(report)["dags"]["detail"]
    shutil.copy(migrated_airflow_db(), database)  # not the session's: earlier tests left DAGs active there
    airflow = str(Path(sys.executable).with_name("airflow"))
    env = {
        **os.environ,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{database}",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
    }

    def run_airflow(*arguments: str) -> None:
        done = subprocess.run([airflow, *arguments], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]

    run_airflow("dags", "reserialize")
    _, report = _doctor(tmp_path)
    dags = _by_name(report)["dags"]
    assert dags["status"] == "warn" and "paused, so they run nothing" in dags["detail"]
    assert "monitor_fraud_model" in dags["detail"] and "synthetic_landing" not in dags["detail"]
    assert "airflow dags unpause" in dags["fix"]
    engine = sa.create_engine(f"sqlite:///{database}")
    with engine.begin() as connection:  # every one active but the monitor
        connection.execute(sa.text("UPDATE dag SET is_paused = 0 WHERE dag_id != 'monitor_fraud_model'"))
    engine.dispose()
    _, report = _doctor(tmp_path)
    assert _by_name(report)["dags"]["detail"] == "paused, so they run nothing: monitor_fraud_model"
    run_airflow("dags", "unpause", "monitor_fraud_model")
    _, report = _doctor(tmp_path)
    assert _by_name(report)["dags"]["status"] == "ok", _by_name(report)["dags"]


def test_the_doctor_says_which_alert_channel_does_not_answer_and_sends_nothing(tmp_path):
    """A real mail receiver and webhook on this machine (tests/receivers.py): both answer; a relay without the
    STARTTLS the settings ask for, and a webhook whose port is closed, are each named. The check connects and
    greets; no alert is sent. Called in process: the command's table is the other tests'."""
    import ssl

    from core.settings import Settings
    from mlops.doctor import _alerts
    from tests.receivers import AlertReceiver, self_signed

    cert_file, key_file = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    plain, secure = AlertReceiver(), AlertReceiver(tls=tls)
    try:

        def alerts_check(receiver: AlertReceiver, **overrides: object):
            channels = {
                "webhook_url": receiver.webhook_url, "email_to": ["risk-team@example.com"],
                "smtp_host": "127.0.0.1", "smtp_port": receiver.smtp_port, **overrides,
            }  # fmt: skip
            return _alerts(Settings(home=tmp_path / "home", alerts=channels))

        assert _alerts(Settings(home=tmp_path / "home")).detail.startswith("no alert channel configured")
        answering = alerts_check(plain)
        assert answering.status == "ok", answering
        assert f"mail 127.0.0.1:{plain.smtp_port}" in answering.detail
        assert "webhook 127.0.0.1" in answering.detail
        assert alerts_check(secure, smtp_starttls=True).status == "ok"

        no_tls = alerts_check(plain, smtp_starttls=True)
        assert no_tls.status == "fail" and "does not offer STARTTLS" in no_tls.detail
        assert f"127.0.0.1:{plain.smtp_port}" in no_tls.detail

        closed = _closed_port()
        silent = alerts_check(plain, webhook_url=f"https://127.0.0.1:{closed}/hooks")
        assert silent.status == "fail" and f"webhook 127.0.0.1:{closed}" in silent.detail
        assert "MLOPS_ALERTS__WEBHOOK_URL" in silent.detail and "mlops alert-egress" in silent.fix
        assert plain.received.mails == [] and plain.received.posts == []  # nothing was sent
    finally:
        plain.close()
        secure.close()
