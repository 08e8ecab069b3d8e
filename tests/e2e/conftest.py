"""One embedded stack for the e2e tests that need it: `mlops demo` starts it (scripts/up.sh) on a fresh
MLOPS_HOME and free ports, and runs the whole chain through Airflow once on a small feed; the demo, REST
API and browser tests then look at that installation. scripts/down.sh stops it after the last e2e test,
and the teardown fails if it leaves a process behind.

Screenshots and other artifacts go to $MLOPS_TEST_ARTIFACTS (default: test-artifacts/ at the repository
root, git-ignored), so CI can keep them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import psutil
import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer", "mlflow", "spark-connect", "serving")
DAG_IDS = {
    "approve_fraud_model",
    "synthetic_landing",
    "ingest_transactions",
    "build_features",
    "retrain_fraud_model",
    "monitor_fraud_model",
    "tune_fraud_model",
    "enforce_retention",
    "score_fraud_batch",
    "erase_customer",
    "reproduce_fraud_model",
}
# Three days of 1500 rows: the first two build the champion, the third a challenger. Labels are taken as
# known after one day (the default of three would leave nothing to train on), and the first model needs no
# minimum AUC-PR: a feed this small holds a handful of frauds, and these tests check the plumbing (runs,
# registry, alias, UIs), not the model's quality (tests/model and tests/data do).
DEMO_ARGS = ("--days", "3", "--rows-per-day", "1500", "--epochs", "3")
DEMO_DATES = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
DEMO_TIMEOUT = 3000  # seconds; about 12 minutes on a 2-core machine shared with other Spark work


def _uses_stack(item: pytest.Item) -> tuple[bool, bool]:
    """The sort key: tests of their own stacks first, then the shared stack's, those that move its champion
    (marker moves_champion) last."""
    on_stack = "demo_stack" in getattr(item, "fixturenames", ())
    return on_stack, on_stack and item.get_closest_marker("moves_champion") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The first test to use `demo_stack` pays for the demo in its setup: give those tests the time.

    The e2e tests that start stacks of their own (the cluster profile, up/down) run before the ones on the
    shared stack, which is package-scoped: it is started after them and stopped after the last e2e test,
    so no two stacks share the 2 cores and the idle stack does not run beside the later tiers."""
    here = Path(__file__).parent
    slots = [k for k, item in enumerate(items) if here in Path(item.fspath).parents]
    ordered = sorted((items[k] for k in slots), key=_uses_stack)  # stable: file order kept otherwise
    for k, item in zip(slots, ordered, strict=True):
        items[k] = item
    for item in items:
        if _uses_stack(item)[0]:
            item.add_marker(pytest.mark.timeout(DEMO_TIMEOUT + 600))


def stack_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without the test session's own Airflow settings (conftest.py sets an
    AIRFLOW_HOME for in-process DAG tests), pointed at `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.pop("MLOPS_PROFILE", None)
    env.pop("MLOPS_SPARK_REMOTE", None)  # the stack starts its own Spark Connect server
    # the scoring service's port too: a stack left running elsewhere on this machine may hold the default
    env.update(MLOPS_HOME=str(home), MLOPS_SERVING__PORT=str(free_port()))
    # The stack's Spark JVMs (its Connect server, a cluster's executors) compile with the client compiler
    # only: on a stack's small feed the server compiler's work never pays back (the shared stack's demo
    # 321 -> 225 s, the cluster chain 213 -> 178 s). Not the tests' own driver: it lives for the whole run,
    # and there the server compiler pays (the in-process modules took 20-50% longer without it).
    env.setdefault("MLOPS_SPARK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")
    env.update(extra)
    return env


def run_script(name: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / name)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def logs(home: Path) -> str:
    return "\n".join(
        f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
        for log in sorted((home / "run").glob("*.log"))
    )


def survivors(groups: set[int]) -> list[str]:
    """Processes still running (zombies aside) in the process groups up.sh started."""
    found = []
    for process in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getpgid(process.pid) in groups and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{process.pid}: {' '.join(process.info['cmdline'] or [])[:120]}")
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def at_most_every(seconds: float, condition: Callable[[], bool]) -> Callable[[], bool]:
    """`condition` asked at most once per `seconds` (its last answer given in between): wait_for polls every
    50 ms, and the api-server that answers shares the machine's cores with the run it reports on."""
    asked: list = [float("-inf"), False]

    def throttled() -> bool:
        if time.monotonic() - asked[0] >= seconds:
            asked[:] = [time.monotonic(), condition()]
        return asked[1]

    return throttled


def mlops_json(
    demo_stack: DemoStack, *arguments: str, timeout: float = 1800, env: dict[str, str] | None = None
) -> dict:
    """`mlops ARGUMENTS --json` against the stack's installation (`env`: settings on top of its own): its
    last stdout line, parsed."""
    mlops = str(Path(sys.executable).with_name("mlops"))
    done = subprocess.run(
        [mlops, *arguments, "--json"],
        env={**demo_stack.env, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"mlops {' '.join(arguments)}: {done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class DemoStack:
    home: Path
    env: dict[str, str]
    summary: dict
    stdout: str
    stderr: str
    airflow_url: str
    mlflow_url: str
    username: str
    password: str
    passwords: dict[str, str]  # every Airflow user's (scripts/up.sh: admin and risk-officer)
    seconds: float

    def token(self) -> str:
        """A JWT for Airflow's REST API (the simple auth manager's POST /auth/token)."""
        import httpx

        answer = httpx.post(
            f"{self.airflow_url}/auth/token", json={"username": self.username, "password": self.password}
        )
        assert answer.status_code == 201, answer.text
        return answer.json()["access_token"]


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    folder = Path(os.environ.get("MLOPS_TEST_ARTIFACTS", REPO / "test-artifacts")).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\ntest artifacts (screenshots): {folder}")
    return folder


@pytest.fixture(scope="package")
def demo_stack(tmp_path_factory) -> DemoStack:
    home = tmp_path_factory.mktemp("demo-stack") / "home"
    env = stack_env(
        home,
        MLOPS_AIRFLOW_PORT=str(free_port()),
        MLOPS_MLFLOW_PORT=str(free_port()),
        MLOPS_SPARK_CONNECT_PORT=str(free_port()),
        MLOPS_UP_TIMEOUT="240",
        MLOPS_TRAINING__LABEL_MATURITY_DAYS="1",
        MLOPS_GATE__FLOOR="0",
        # test_tuning: a small study, two trials at a time (the DAG maps its trials when the stack parses it)
        MLOPS_TUNING__TRIALS="4",
        MLOPS_TUNING__PARALLELISM="2",
        MLOPS_TUNING__EPOCHS="2",
    )
    mlops = str(Path(sys.executable).with_name("mlops"))
    groups: set[int] = set()
    try:
        started = time.monotonic()
        done = subprocess.run(
            [mlops, "demo", *DEMO_ARGS, "--timeout", str(DEMO_TIMEOUT - 300), "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT,
        )
        seconds = time.monotonic() - started
        print(f"\nmlops demo {' '.join(DEMO_ARGS)} through Airflow: {seconds:.0f}s")
        groups = {int(p.read_text()) for p in (home / "run").glob("*.pid")}
        assert done.returncode == 0, f"{done.stderr[-6000:]}\n{logs(home)}"
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        passwords = json.loads(
            (home / "airflow" / "simple_auth_manager_passwords.json.generated").read_text()
        )
        yield DemoStack(
            home=home,
            env=env,
            summary=summary,
            stdout=done.stdout,
            stderr=done.stderr,
            airflow_url=summary["airflow_url"],
            mlflow_url=summary["mlflow_url"],
            username="admin",
            password=passwords["admin"],
            passwords=passwords,
            seconds=seconds,
        )
    finally:
        # `make down`: every component stopped, no process of theirs left, and a second call is a no-op.
        groups |= {int(p.read_text()) for p in (home / "run").glob("*.pid")}
        down = run_script("down.sh", env, timeout=180)
        assert down.returncode == 0, down.stderr
        if groups:
            for name in COMPONENTS:
                assert f"down: stopped {name}" in down.stdout, down.stdout
        assert not list((home / "run").glob("*.pid")), down.stdout
        assert survivors(groups) == [], down.stdout
        assert run_script("down.sh", env, timeout=60).stdout.startswith("down: nothing to stop")
