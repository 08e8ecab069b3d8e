"""The demo's watchdog of the embedded stack: an Airflow component whose process exited (the scheduler can
die of an SQLite race) is started again, its log kept; a live one is left alone; restarts are bounded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from core.settings import Settings
from mlops.stack import StackError, StackWatchdog, stopped_components

pytestmark = pytest.mark.unit


def _exited_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = Settings(home=tmp_path / "home")
    run = settings.home / "run"
    run.mkdir(parents=True)
    (run / "scheduler.pid").write_text(f"{_exited_pid()}\n")
    (run / "scheduler.log").write_text("sqlalchemy.orm.exc.StaleDataError: UPDATE ... table 'dag_run'\n")
    (run / "triggerer.pid").write_text(f"{os.getpid()}\n")  # alive
    return settings


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
