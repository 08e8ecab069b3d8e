"""The embedded stack of `make up` / `make down` seen from Python: start and stop it with the same scripts
(scripts/up.sh, scripts/down.sh), and find its URLs (Airflow, MLflow, the scoring service) and login.

The scripts are the one place that knows how each component starts; this module only runs them, streams
their output and reads what they print and write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.settings import REPO_ROOT, Settings

UP = REPO_ROOT / "scripts" / "up.sh"
DOWN = REPO_ROOT / "scripts" / "down.sh"
PASSWORD_FILE = "simple_auth_manager_passwords.json.generated"


class StackError(RuntimeError):
    """The stack could not be started, stopped or logged into; the message says where to look."""


@dataclass(frozen=True)
class Stack:
    airflow_url: str
    mlflow_url: str
    # The scoring service (`mlops serve`): live once the stack is up, ready (GET /v2/health/ready) only once a
    # champion exists.
    scoring_url: str
    username: str
    password: str
    password_file: Path
    already_running: bool  # every component was up before: the stack's settings are the ones it started with


def _run_script(script: Path, env: dict[str, str], echo: Callable[[str], None]) -> tuple[int, str]:
    """Run a stack script, passing each line of its output to `echo`; return its exit code and output."""
    lines: list[str] = []
    with subprocess.Popen(
        ["bash", str(script)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            echo(lines[-1])
    return process.returncode, "\n".join(lines)


def up(settings: Settings, env: dict[str, str] | None = None, echo: Callable[[str], None] = print) -> Stack:
    """scripts/up.sh (idempotent), then the URLs it printed and the Airflow login it wrote."""
    env = {**os.environ, **(env or {})}
    code, output = _run_script(UP, env, echo)
    if code:
        raise StackError(f"scripts/up.sh exited {code}; its output is above (logs: {settings.home / 'run'})")
    airflow = re.search(r"^Airflow:\s+(\S+)", output, re.MULTILINE)
    mlflow = re.search(r"^MLflow:\s+(\S+)", output, re.MULTILINE)
    scoring = re.search(r"^Scoring:\s+(\S+)", output, re.MULTILINE)
    if not airflow or not mlflow or not scoring:
        raise StackError(
            f"scripts/up.sh printed no 'Airflow:', 'MLflow:' and 'Scoring:' lines:\n{output[-2000:]}"
        )
    username = env.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "admin:admin").split(",")[0].split(":")[0]
    password_file = settings.airflow_home / PASSWORD_FILE
    try:
        password = json.loads(password_file.read_text())[username]
    except (OSError, ValueError, KeyError) as exc:
        raise StackError(
            f"no password for Airflow user {username!r} in {password_file} ({exc}); the api-server writes it "
            f"when it starts: read {settings.home / 'run' / 'api-server.log'}"
        ) from exc
    return Stack(
        airflow_url=airflow.group(1),
        mlflow_url=mlflow.group(1),
        scoring_url=scoring.group(1),
        username=username,
        password=password,
        password_file=password_file,
        already_running=not re.search(r"^up: started ", output, re.MULTILINE),
    )


def down(env: dict[str, str] | None = None, echo: Callable[[str], None] = print) -> None:
    """scripts/down.sh: stop what up.sh started."""
    code, _ = _run_script(DOWN, {**os.environ, **(env or {})}, echo)
    if code:
        raise StackError(f"scripts/down.sh exited {code}; its output is above")


# The Airflow components that keep a run going; up.sh writes each one's pid to $MLOPS_HOME/run/<name>.pid
# (and the scoring service's to serving.pid, which a run does not need).
AIRFLOW_COMPONENTS = ("scheduler", "dag-processor", "triggerer")


def stopped_components(settings: Settings, names: tuple[str, ...] = AIRFLOW_COMPONENTS) -> list[str]:
    """The components among `names` that up.sh started and whose process has exited since."""
    gone = []
    for name in names:
        try:
            pid = int((settings.home / "run" / f"{name}.pid").read_text())
        except (OSError, ValueError):
            continue  # not started by up.sh (another stack, or none): not ours to watch
        if not _alive(pid):
            gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    """A process that exists and has not exited: up.sh's components outlive it and are re-parented, and
    a parent that does not reap them leaves zombies (state Z), which still answer a signal 0."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        # /proc/<pid>/stat: "pid (comm) state ..."; comm may hold spaces or parentheses, so split after it.
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True  # no /proc (not Linux): signal 0 is all there is
    return state != "Z"


class StackWatchdog:
    """Restarts Airflow components of the embedded stack that exited while the demo waits on them.

    On SQLite the scheduler can die of a race with the API server (sqlalchemy StaleDataError on `dag_run`,
    seen while a backfill creates its runs); every queued run then waits forever. Called on each poll, it
    looks every `every_s` seconds; an exited component's log is kept as `<name>.log.exited-<n>` and
    scripts/up.sh (idempotent) starts it again. More than `max_restarts` restarts is a StackError."""

    def __init__(
        self,
        settings: Settings,
        restart: Callable[[], object],
        echo: Callable[[str], None] = print,
        every_s: float = 20.0,
        max_restarts: int = 3,
    ) -> None:
        self.settings, self.restart, self.echo = settings, restart, echo
        self.every_s, self.max_restarts = every_s, max_restarts
        self.restarts = 0
        self._next = time.monotonic() + every_s

    def __call__(self) -> None:
        if time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_s
        gone = stopped_components(self.settings)
        if not gone:
            return
        run = self.settings.home / "run"
        if self.restarts >= self.max_restarts:
            raise StackError(
                f"the stack's {', '.join(gone)} exited again after {self.restarts} restarts; read "
                f"{', '.join(str(run / f'{name}.log') for name in gone)} and the kept logs beside them"
            )
        self.restarts += 1
        kept = []
        for name in gone:
            log = run / f"{name}.log"
            if log.is_file():
                kept.append(shutil.copy(log, run / f"{name}.log.exited-{self.restarts}"))
        self.echo(
            f"the stack's {', '.join(gone)} exited (its log: {', '.join(map(str, kept)) or 'none'}); "
            "restarting it with scripts/up.sh"
        )
        self.restart()
