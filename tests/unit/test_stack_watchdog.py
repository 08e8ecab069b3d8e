"""The demo's watchdog of the embedded stack: an Airflow component whose process exited (the scheduler can
die of an SQLite race) is started again, its log kept; a live one is left alone; restarts are bounded."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.settings import Settings
from mlops.stack import StackError, StackWatchdog, stopped_components
from tests.conftest import wait_for

pytestmark = pytest.mark.unit


_UNREAPED: list[subprocess.Popen] = []


def _exited_pid(reaped: bool) -> int:
    """A process that has exited: reaped, or a zombie (as up.sh's components become when they die under a
    parent that does not reap them: they still answer a signal 0)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    if reaped:
        child.wait()
    else:
        _UNREAPED.append(child)  # kept, not waited for: a zombie until the test ends
        stat = Path(f"/proc/{child.pid}/stat")
        wait_for(lambda: stat.read_text().rpartition(")")[2].split()[0] == "Z", 30, f"{child.pid} to exit")
    return child.pid


@pytest.fixture(params=["reaped", "zombie"])
def settings(tmp_path, request) -> Iterator[Settings]:
    settings = Settings(home=tmp_path / "home")
    run = settings.home / "run"
    run.mkdir(parents=True)
    (run / "scheduler.pid").write_text(f"{_exited_pid(request.param == 'reaped')}\n")
    (run / "scheduler.log").write_text("sqlalchemy.orm.exc.StaleDataError: UPDATE ... table 'dag_run'\n")
    (run / "triggerer.pid").write_text(f"{os.getpid()}\n")  # alive
    yield settings
    for child in _UNREAPED:
        child.wait()


def test_an_exited_component_is_restarted_once_and_its_log_kept(settings):
    restarts: list[str] = []
    said: list[str] = []

    def restart() -> None:
        restarts.append("up")
        (settings.home / "run" / "scheduler.pid").write_text(f"{os.getpid()}\n")  # up.sh started it again

    watchdog = StackWatchdog(settings, restart, said.append, every_s=0.0)
    assert stopped_components(settings) == ["scheduler"]
    watchdog()
    watchdog()  # now running: nothing more to do
    assert restarts == ["up"]
    kept = settings.home / "run" / "scheduler.log.exited-1"
    assert "StaleDataError" in kept.read_text()
    assert "scheduler exited" in said[0] and str(kept) in said[0]


def test_a_component_that_keeps_exiting_is_an_error_naming_its_log(settings):
    watchdog = StackWatchdog(settings, lambda: None, lambda _: None, every_s=0.0, max_restarts=2)
    watchdog()
    watchdog()
    with pytest.raises(StackError, match=r"scheduler exited again after 2 restarts; read .*scheduler\.log"):
        watchdog()


def test_nothing_is_restarted_while_every_component_runs_or_was_never_started(tmp_path):
    settings = Settings(home=tmp_path / "home")
    (settings.home / "run").mkdir(parents=True)
    (settings.home / "run" / "scheduler.pid").write_text(f"{os.getpid()}\n")
    watchdog = StackWatchdog(settings, lambda: pytest.fail("restarted"), lambda _: None, every_s=0.0)
    watchdog()
    assert stopped_components(settings) == []
