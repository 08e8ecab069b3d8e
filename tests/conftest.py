"""Test harness: tiers by folder, an isolated Airflow home, and a report of DAG parse times.

Airflow reads its configuration when it is first imported, so its environment is set here, before any
test module imports it. Every test session gets its own AIRFLOW_HOME and MLOPS_HOME, removed afterwards.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIERS = ("unit", "dags", "data", "model", "integration", "e2e")

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="mlops-tests-"))
os.environ["AIRFLOW_HOME"] = str(_SESSION_DIR / "airflow")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_SESSION_DIR / 'airflow' / 'airflow.db'}"
os.environ["MLOPS_HOME"] = str(_SESSION_DIR / "mlops-home")
os.environ.pop("MLOPS_PROFILE", None)
# py4j logs "closing down" from finalizers after pytest has closed its streams.
logging.getLogger("py4j").setLevel(logging.WARNING)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test's tier is the folder it lives in: a new test file needs no marker to be selected."""
    for item in items:
        parts = Path(item.fspath).relative_to(REPO / "tests").parts
        if parts and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


PARSE_TIMES: dict[str, float] = {}


def _free_disk() -> str:
    """Free space where the tests write (the temporary folder, the checkout, podman's storage): a run that
    fills the disk fails in many unrelated ways, and this line tells it apart."""
    places = {"tmp": Path(tempfile.gettempdir()), "checkout": REPO, "podman": Path("/var/lib/containers")}
    shown = []
    for name, place in places.items():
        if place.exists():
            shown.append(f"{name} {shutil.disk_usage(place).free / 2**30:.1f} GiB")
    return "free disk: " + ", ".join(shown)


def pytest_report_header(config: pytest.Config) -> str:
    return _free_disk()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    terminalreporter.write_line(f"at the end, {_free_disk()}")
    if PARSE_TIMES:
        terminalreporter.section("DAG parse time (import of the file, after airflow.sdk)")
        for name, seconds in sorted(PARSE_TIMES.items()):
            terminalreporter.write_line(f"  {name:<40} {seconds * 1000:8.1f} ms")


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each test gets its own MLOPS_HOME and a fresh settings cache."""
    from core.settings import get_settings

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "mlops-home"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the test process, configured as the pipeline configures it."""
    from core.settings import Settings
    from pipelines.spark import spark_session

    session = spark_session(Settings(spark_driver_memory="1g", spark_shuffle_partitions=2))
    yield session
    session.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise TimeoutError(f"gave up after {timeout:.0f}s waiting for {what}")


SPARK_WORKERS = 2


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory):
    """A Spark standalone cluster on loopback: a Master and two Workers (one core, 1 GiB each), started with
    the pyspark package's own spark-class, stopped at the end of the session. Yields the master URL; the
    Master's JSON status is at `spark_standalone_status(url)`."""
    import pyspark

    spark_home = Path(pyspark.__file__).parent
    spark_class = str(spark_home / "bin" / "spark-class")
    work = tmp_path_factory.mktemp("spark-standalone")
    port, ui = free_port(), free_port()
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    url = f"spark://127.0.0.1:{port}"
    commands = {
        "master": ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
                   "--webui-port", str(ui)],
        **{
            f"worker-{n}": ["org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                            "--memory", "1g", "--webui-port", str(free_port()), "--work-dir",
                            str(work / f"worker-{n}"), url]
            for n in range(1, SPARK_WORKERS + 1)
        },
    }  # fmt: skip
    processes = []
    logs = []
    for name, arguments in commands.items():
        logs.append((work / f"{name}.log").open("w"))
        processes.append(
            subprocess.Popen(
                [spark_class, *arguments],
                env=env,
                stdout=logs[-1],
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    _STANDALONE_UI[url] = f"http://127.0.0.1:{ui}/json/"

    def workers_alive() -> bool:
        status = spark_standalone_status(url)
        return status is not None and status.get("aliveworkers", 0) >= SPARK_WORKERS

    try:
        wait_for(workers_alive, 120, f"{SPARK_WORKERS} Spark workers to register with {url} (logs in {work})")
        yield url
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        for handle in logs:
            handle.close()


_STANDALONE_UI: dict[str, str] = {}


def spark_standalone_status(url: str) -> dict | None:
    """The Master's JSON status (workers, active and completed applications), None while it is not up."""
    try:
        with urllib.request.urlopen(_STANDALONE_UI[url], timeout=2) as response:
            return json.load(response)
    except (OSError, ValueError):  # not up yet, or the UI answers before its JSON endpoint is ready
        return None
