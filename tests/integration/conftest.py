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
