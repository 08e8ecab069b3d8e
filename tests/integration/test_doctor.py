"""`mlops doctor` reports truthfully on this machine: real Java, a real Spark job, real services."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

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
