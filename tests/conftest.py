"""Test harness: tiers by folder, an isolated Airflow home, and a report of DAG parse times.

Airflow reads its configuration when it is first imported, so its environment is set here, before any
test module imports it. Every test session gets its own AIRFLOW_HOME and MLOPS_HOME, removed afterwards.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
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


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if PARSE_TIMES:
        terminalreporter.section("DAG parse time (import of the file, after airflow.sdk)")
        for name, seconds in sorted(PARSE_TIMES.items()):
            terminalreporter.write_line(f"  {name:<40} {seconds * 1000:8.1f} ms")


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each test gets its own MLOPS_HOME and a fresh settings cache."""
    from mlops.settings import get_settings

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "mlops-home"))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the test process, configured as the pipeline configures it."""
    from mlops.settings import Settings
    from pipelines.spark import spark_session

    session = spark_session(Settings(spark_driver_memory="1g", spark_shuffle_partitions=2))
    yield session
    session.stop()
