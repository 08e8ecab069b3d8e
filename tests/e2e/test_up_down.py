"""`make up` / `make down` (scripts/up.sh, scripts/down.sh) on a fresh MLOPS_HOME and free ports: Airflow's
REST API, reached with the login up.sh prints, lists the four DAGs with no import errors; MLflow answers;
a second `up` starts nothing; `down` leaves no process of either behind."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer", "mlflow")
DAG_IDS = {"synthetic_landing", "ingest_transactions", "build_features", "retrain_fraud_model"}
STARTUP_TIMEOUT = 180


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _script(name: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / name)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _request(url: str, *, token: str | None = None, body: dict | None = None) -> tuple[int, dict | str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, payload = response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        status, payload = error.code, error.read().decode()
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload


def _logs(run: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}" for log in sorted(run.glob("*.log"))
    )


def _survivors(groups: set[int]) -> list[str]:
    """Processes still running (zombies aside) in the process groups up.sh started."""
    found = []
    for process in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getpgid(process.pid) in groups and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:120]}")
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def test_up_serves_airflow_and_mlflow_and_down_stops_them(tmp_path):
    home = tmp_path / "home"
    run = home / "run"
    airflow_port, mlflow_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}  # the test session's own
    env.pop("MLOPS_PROFILE", None)
    env.update(
        MLOPS_HOME=str(home),
        MLOPS_AIRFLOW_PORT=str(airflow_port),
        MLOPS_MLFLOW_PORT=str(mlflow_port),
        MLOPS_UP_TIMEOUT=str(STARTUP_TIMEOUT),
    )
    airflow, mlflow = f"http://127.0.0.1:{airflow_port}", f"http://127.0.0.1:{mlflow_port}"
    groups: set[int] = set()
    try:
        started = time.monotonic()
        up = _script("up.sh", env, timeout=STARTUP_TIMEOUT + 240)  # + the database migration
        print(f"up.sh took {time.monotonic() - started:.0f}s")
        assert up.returncode == 0, f"{up.stdout}\n{up.stderr}\n{_logs(run)}"
        groups = {int((run / f"{name}.pid").read_text()) for name in COMPONENTS}
        assert f"Airflow:  {airflow}" in up.stdout and f"MLflow:   {mlflow}" in up.stdout
        username, password = re.search(r"login: (\S+) / (\S+);", up.stdout).groups()

        assert _request(f"{airflow}/auth/token", body={"username": username, "password": "wrong"})[0] == 401
        status, answer = _request(f"{airflow}/auth/token", body={"username": username, "password": password})
        assert status == 201, answer
        token = answer["access_token"]
        assert _request(f"{airflow}/api/v2/dags")[0] == 401  # the API is not open without a token

        # The dag-processor heartbeats before its first parse finishes: wait for the DAGs to appear.
        deadline, dag_ids = time.monotonic() + STARTUP_TIMEOUT, set()
        while time.monotonic() < deadline:
            status, dags = _request(f"{airflow}/api/v2/dags?limit=100", token=token)
            assert status == 200, dags
            dag_ids = {dag["dag_id"] for dag in dags["dags"]}
            if dag_ids >= DAG_IDS:
                break
            time.sleep(2)
        assert dag_ids == DAG_IDS, f"DAGs listed: {sorted(dag_ids)}\n{_logs(run)}"
        status, errors = _request(f"{airflow}/api/v2/importErrors", token=token)
        assert (status, errors["total_entries"]) == (200, 0), errors

        assert _request(f"{mlflow}/health") == (200, "OK")

        again = _script("up.sh", env, timeout=120)
        assert again.returncode == 0, again.stderr
        for name in COMPONENTS:
            assert f"up: {name} is already running" in again.stdout
        assert "started" not in again.stdout
        assert {int((run / f"{name}.pid").read_text()) for name in COMPONENTS} == groups
    finally:
        down = _script("down.sh", env, timeout=180)

    assert down.returncode == 0, down.stderr
    for name in COMPONENTS:
        assert f"down: stopped {name}" in down.stdout
    assert not list(run.glob("*.pid"))
    assert _survivors(groups) == []
    assert _script("down.sh", env, timeout=60).stdout.startswith("down: nothing to stop")


def test_up_refuses_a_port_another_program_holds_and_starts_nothing(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.pop("MLOPS_PROFILE", None)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        env.update(MLOPS_HOME=str(home), MLOPS_AIRFLOW_PORT=str(port), MLOPS_MLFLOW_PORT=str(_free_port()))
        up = _script("up.sh", env, timeout=120)
    assert up.returncode == 1
    assert f"port {port} (for api-server) is taken by another program" in up.stderr
    assert "MLOPS_AIRFLOW_PORT" in up.stderr
    assert not list((home / "run").glob("*.pid"))
