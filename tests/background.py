"""Set-ups that start beside the tests (docs/testing.md, "Set-ups started early").

Most of a large set-up's time is a subprocess the test process only waits for: the shared demo stack's
`mlops demo`, the podman image builds, `dvc repro` from nothing, the reference lake's build. Measured on a
clean clone run serially (docs/benchmarks.md, "Test-suite time"), the two cores were idle for about half of
the run's wall time, much of it while one of these waited on Airflow's scheduling, on apt or on podman. So at
the end of collection, where a selected test needs one of them, it is started in the background
(`tests/conftest.py`, `pytest_collection_finish`), and the fixture that hands it to its tests claims the
running process instead of starting its own; the tests that need one run after tests that do not
(`tests/conftest.py`, `pytest_collection_modifyitems`), so the set-ups overlap other work.

A background set-up is exactly what the fixture would run in the foreground: same command, environment and
checks, the same timeouts counted from its start. A fixture that finds none started (a run of one module,
parallel workers, MLOPS_TEST_BACKGROUND=0) starts it itself and waits, as before. What is started and never
claimed (a run stopped early) is stopped at the session's end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENABLED_ENV = "MLOPS_TEST_BACKGROUND"


@dataclass
class Started:
    """A set-up's process, started in a session of its own (its whole tree can be stopped), its output in
    files (a pipe nobody reads would fill and stop it)."""

    name: str
    process: subprocess.Popen
    out: Path
    err: Path
    started: float = field(default_factory=time.monotonic)
    on_abandon: Callable[[], None] | None = None  # how to stop what it left running when never claimed
    context: dict[str, Any] = field(default_factory=dict)  # what its fixture needs besides the result

    def wait(self, timeout: float) -> subprocess.CompletedProcess[str]:
        """Its result, waiting at most until `timeout` seconds after its start (then it is stopped and
        TimeoutExpired raised, as subprocess.run would)."""
        left = max(1.0, timeout - (time.monotonic() - self.started))
        try:
            code = self.process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        out, err = (path.read_text(errors="replace") for path in (self.out, self.err))
        return subprocess.CompletedProcess(self.process.args, code, out, err)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


_STARTED: dict[str, Started] = {}


def enabled() -> bool:
    """Background set-ups are for one test process: under pytest-xdist each worker would start its own."""
    return os.environ.get(ENABLED_ENV, "1") != "0" and "PYTEST_XDIST_WORKER" not in os.environ


def launch(
    name: str,
    args: list[str],
    *,
    folder: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    on_abandon: Callable[[], None] | None = None,
    context: dict[str, Any] | None = None,
) -> Started:
    """Start `args` now and keep it under `name` for a fixture to claim."""
    folder.mkdir(parents=True, exist_ok=True)
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        process = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, text=True,
            start_new_session=True,
        )  # fmt: skip
    started = Started(name, process, out, err, on_abandon=on_abandon, context=context or {})
    _STARTED[name] = started
    return started


def claim(name: str) -> Started | None:
    """The set-up started under `name`, handed over once (None where none was started)."""
    return _STARTED.pop(name, None)


def stop_unclaimed() -> list[str]:
    """At the session's end: stop every set-up no fixture claimed (and what it left running)."""
    stopped = []
    for name, started in list(_STARTED.items()):
        if started.process.poll() is None:
            started.kill()
        if started.on_abandon is not None:
            started.on_abandon()
        stopped.append(name)
        del _STARTED[name]
    return stopped
