from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated Airflow metadata database (SQLite) in this test session's AIRFLOW_HOME."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run(
        [str(airflow), "db", "migrate"], check=True, capture_output=True, env=os.environ.copy(), timeout=600
    )
    return home


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory):
    """A Spark standalone cluster on loopback: one Master and one Worker, started with the pyspark
    package's own spark-class, stopped at the end of the session. Yields the master URL."""
    import json
    import signal
    import urllib.request

    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui, worker_ui = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_WORKER_DIR": str(work / "worker"),
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    logs = (work / "master.log").open("w"), (work / "worker.log").open("w")
    master = subprocess.Popen(
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui),
        ],
        env=env,
        stdout=logs[0],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            "127.0.0.1",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--webui-port",
            str(worker_ui),
            url,
        ],
        env=env,
        stdout=logs[1],
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def workers_alive() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as response:
                return json.load(response).get("aliveworkers", 0) >= 1
        except (OSError, ValueError):  # not up yet, or the UI answers before its JSON endpoint is ready
            return False

    try:
        wait_for(workers_alive, 120, f"a Spark worker to register with {url} (logs in {work})")
        yield url
    finally:
        for process in (worker, master):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        for handle in logs:
            handle.close()
