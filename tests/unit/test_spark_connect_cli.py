"""`mlops spark-connect`, the command the cluster's Spark Connect Deployment runs: the spark-submit it hands
over to (captured instead of exec'd), and a bad --conf refused before anything starts."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from mlops.cli import app
from pipelines.spark import CONNECT_APP_NAME, CONNECT_SERVER_CLASS


class ExecCalledError(Exception):
    pass


@pytest.fixture
def execs(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    seen: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        seen.append([path, *argv[1:]])
        raise ExecCalledError

    monkeypatch.setattr(os, "execv", execv)
    return seen


def _conf(argv: list[str]) -> dict[str, str]:
    pairs = [argv[k + 1] for k, arg in enumerate(argv) if arg == "--conf"]
    return dict(pair.split("=", 1) for pair in pairs)


def test_the_server_runs_spark_submit_with_the_settings_driver_options_and_the_given_address(
    execs, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_CLUSTER__SPARK_MASTER", "spark://spark-master.example:7077")
    monkeypatch.setenv("MLOPS_CLUSTER__SPARK_DRIVER_HOST", "10.1.2.3")
    monkeypatch.setenv("MLOPS_SPARK_DRIVER_MEMORY", "3g")
    done = CliRunner().invoke(
        app, ["spark-connect", "--host", "0.0.0.0", "--port", "15010", "--conf", "spark.executor.memory=2g"]
    )
    assert isinstance(done.exception, ExecCalledError), done.output
    (argv,) = execs
    assert argv[0].endswith("/pyspark/bin/spark-submit")
    assert argv[argv.index("--class") + 1] == CONNECT_SERVER_CLASS
    assert argv[argv.index("--name") + 1] == CONNECT_APP_NAME
    assert argv[argv.index("--master") + 1] == "spark://spark-master.example:7077"
    conf = _conf(argv)
    assert conf["spark.driver.memory"] == "3g"
    assert conf["spark.driver.host"] == "10.1.2.3"  # executors reach the driver at the pod's address
    assert conf["spark.connect.grpc.binding.address"] == "0.0.0.0"
    assert conf["spark.connect.grpc.binding.port"] == "15010"
    assert conf["spark.executor.memory"] == "2g"


@pytest.mark.parametrize("bad", ["spark.executor.memory", "executor.memory=2g", "spark.executor.memory="])
def test_a_conf_that_is_not_a_spark_setting_is_refused_naming_it(execs, bad: str):
    done = CliRunner().invoke(app, ["spark-connect", "--conf", bad])
    assert done.exit_code == 2 and execs == []
    assert bad in done.output and "spark.<name>=<value>" in done.output
