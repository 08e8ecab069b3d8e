"""`make up` / `make down` (scripts/up.sh, scripts/down.sh). The shared `demo_stack` was started by up.sh
(through `mlops demo`) on a fresh MLOPS_HOME and free ports; its teardown runs down.sh and fails if a
component survives or a second down.sh finds anything to stop. Here: a second `up` starts nothing and
prints the same URLs and login, MLflow answers, the scoring service is live and serves the champion the demo
made, and a port held by another program stops `up` early."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port, wait_for
from tests.e2e.conftest import COMPONENTS, run_script, stack_env

# What up.sh starts: the components the shared fixture stops and checks, and the scoring service.
STACK = (*COMPONENTS, "serving")


def test_up_again_starts_nothing_and_prints_the_same_urls_and_login(demo_stack):
    run = demo_stack.home / "run"
    pids = {name: (run / f"{name}.pid").read_text() for name in STACK}
    again = run_script("up.sh", demo_stack.env, timeout=120)
    assert again.returncode == 0, again.stderr
    for name in STACK:
        assert f"up: {name} is already running" in again.stdout
    assert "started" not in again.stdout
    assert {name: (run / f"{name}.pid").read_text() for name in STACK} == pids
    assert f"Airflow:  {demo_stack.airflow_url}" in again.stdout
    assert f"MLflow:   {demo_stack.mlflow_url}" in again.stdout
    # every user's login, the pipeline's first, then the approver's (scripts/up.sh)
    logins = re.search(r"login: ([^;]+);", again.stdout)
    assert logins, again.stdout
    assert logins.group(1) == ", ".join(
        f"{user} / {password}" for user, password in demo_stack.passwords.items()
    )
    assert list(demo_stack.passwords) == [demo_stack.username, "risk-officer"]
    health = httpx.get(f"{demo_stack.mlflow_url}/health")
    assert (health.status_code, health.text) == (200, "OK")


def test_the_scheduler_holds_torch_and_mlflow_for_the_task_processes_it_forks(demo_stack):
    """orchestration/scheduler.py: the scheduler imported them once; every task process forked from it (the
    LocalExecutor's workers, then the supervisor) starts with them loaded."""
    pid = int((demo_stack.home / "run" / "scheduler.pid").read_text())
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libtorch" in maps
    command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert b"orchestration.scheduler" in command


def test_the_stacks_scoring_service_is_live_and_serves_the_champion_the_demo_made(demo_stack):
    """up.sh waited for /v2/health/live only (there was no champion yet); the service follows the champion
    alias, so after the demo it is ready too, without a restart."""
    again = run_script("up.sh", demo_stack.env, timeout=120)
    (scoring_url,) = re.findall(r"^Scoring:\s+(\S+)", again.stdout, re.MULTILINE)
    port = demo_stack.env.get("MLOPS_SERVING__PORT", "8000")
    assert scoring_url == f"http://127.0.0.1:{port}"
    assert httpx.get(f"{scoring_url}/v2/health/live").status_code == 200
    wait_for(
        lambda: httpx.get(f"{scoring_url}/v2/health/ready").status_code == 200,
        60,
        f"{scoring_url}/v2/health/ready to answer 200 after the demo",
    )


def test_the_doctor_runs_a_spark_job_on_the_stacks_spark_connect_server(demo_stack):
    """The tasks' Spark goes to the stack's Spark Connect server; `mlops doctor` checks it the same way."""
    remote = f"sc://127.0.0.1:{demo_stack.env['MLOPS_SPARK_CONNECT_PORT']}"
    done = subprocess.run(
        [str(Path(sys.executable).with_name("mlops")), "doctor", "--json"],
        env={**demo_stack.env, "MLOPS_SPARK_REMOTE": remote},
        capture_output=True,
        text=True,
        timeout=300,
    )
    checks = {c["name"]: c for c in json.loads(done.stdout.strip().splitlines()[-1])["checks"]}
    assert checks["spark"]["status"] == "ok", checks["spark"]
    assert f"Spark Connect server {remote}" in checks["spark"]["detail"]


PORT_VARIABLES = {
    "api-server": "MLOPS_AIRFLOW_PORT",
    "mlflow": "MLOPS_MLFLOW_PORT",
    "spark-connect": "MLOPS_SPARK_CONNECT_PORT",
    "serving": "MLOPS_SERVING__PORT",
}


@pytest.mark.parametrize("component", ["api-server", "serving"])
def test_up_refuses_a_port_another_program_holds_and_starts_nothing(tmp_path: Path, component):
    home = tmp_path / "home"
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        ports = {variable: str(free_port()) for variable in PORT_VARIABLES.values()}
        env = stack_env(home, **{**ports, PORT_VARIABLES[component]: str(port)})
        up = run_script("up.sh", env, timeout=120)
    assert up.returncode == 1
    assert f"port {port} (for {component}) is taken by another program" in up.stderr
    assert PORT_VARIABLES[component] in up.stderr
    assert not list((home / "run").glob("*.pid"))
