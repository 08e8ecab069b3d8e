"""The local train task's child process ends with its task: on its timeout and when the task process gets
SIGTERM (how Airflow stops a task), the child and everything it started are stopped, with an error that
says why. A fake training entry stands in for `python -m training`: it starts a grandchild that ignores
SIGTERM (as a busy DataLoader worker might), writes both pids, logs a line and sleeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from orchestration.training_task import TrainingProcessError, run_training_process
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]

FAKE_TRAINING = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # inherited by the grandchild, through exec
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    pids = sys.argv[1]
    with open(pids + ".tmp", "w") as out:
        out.write(f"{os.getpid()} {grandchild.pid}")
    os.rename(pids + ".tmp", pids)
    print("epoch 1: still training", file=sys.stderr, flush=True)
    time.sleep(600)
    """
)

# The task process: what Airflow's task runner is to the local train task.
TASK = textwrap.dedent(
    """
    import sys

    from orchestration.training_task import run_training_process

    run_training_process([sys.argv[1]], timeout_s=600, program=("-c", sys.argv[2]), grace_s=1)
    """
)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie has stopped, unreaped
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def pids_file(tmp_path):
    """Where the fake training writes its pid and its grandchild's; whatever of them a failed test leaves
    running is killed afterwards."""
    path = tmp_path / "pids"
    yield path
    if path.exists():
        for pid in map(int, path.read_text().split()):
            if _running(pid):
                os.kill(pid, signal.SIGKILL)


def _pids_written(path: Path, task: subprocess.Popen) -> list[int]:
    wait_for(lambda: path.exists() or task.poll() is not None, 120, "the fake training to write its pids")
    assert path.exists(), f"the task process exited {task.returncode}: {task.stderr.read()}"
    return [int(pid) for pid in path.read_text().split()]


def test_the_timeout_stops_the_child_and_its_grandchild(pids_file):
    with pytest.raises(TrainingProcessError) as raised:
        run_training_process([str(pids_file)], timeout_s=8, program=("-c", FAKE_TRAINING), grace_s=1)

    message = str(raised.value)
    assert "ran past its timeout of 8 s" in message and "LOCAL_TIMEOUT_MINUTES" in message
    assert "`python -c" in message and str(pids_file) in message  # the command
    assert "epoch 1: still training" in message  # the end of its log
    child, grandchild = map(int, pids_file.read_text().split())
    assert not _running(child)
    assert not _running(grandchild)  # it ignored SIGTERM: the SIGKILL after the grace stopped it


def test_sigterm_to_the_task_process_stops_the_child_and_its_grandchild(pids_file):
    task = subprocess.Popen(
        [sys.executable, "-c", TASK, str(pids_file), FAKE_TRAINING],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child, grandchild = _pids_written(pids_file, task)
        assert _running(child) and _running(grandchild)
        task.send_signal(signal.SIGTERM)  # what Airflow sends a task it stops
        _, stderr = task.communicate(timeout=120)
    finally:
        if task.poll() is None:
            task.kill()
            task.wait()

    assert task.returncode == 1, stderr
    assert "TrainingProcessError" in stderr and "the task process got SIGTERM" in stderr
    assert "`python -c" in stderr
    assert not _running(child)
    assert not _running(grandchild)


@pytest.mark.parametrize(
    ("script", "outcome"),
    [
        ("print('starting'); print('{\"run_id\": \"abc\"}')", {"run_id": "abc"}),
        ("import sys; print('no such training set', file=sys.stderr); sys.exit(1)", "exited 1:\nno such"),
        ("pass", "printed no result"),
    ],
    ids=["result", "failure", "no-result"],
)
def test_the_result_is_the_last_stdout_line_and_a_failure_names_the_command(script, outcome):
    if isinstance(outcome, dict):
        assert run_training_process(["train"], timeout_s=120, program=("-c", script)) == outcome
        return
    with pytest.raises(TrainingProcessError, match=outcome) as raised:
        run_training_process(["train"], timeout_s=120, program=("-c", script))
    assert str(raised.value).startswith(f"`python -c {script}")


def test_a_refusal_of_the_training_command_fails_the_task_without_retries():
    """Exit 3 is the training CLI's PipelineError (a diverged run, bad training data): the task must fail
    for good, with the CLI's message, not retry twice for nothing."""
    from airflow.sdk.exceptions import AirflowFailException

    from core.errors import PipelineError
    from orchestration.tasks import fail_fast_on_bad_data
    from orchestration.training_task import TrainingRefusedError

    script = (
        "import json, sys; print('loading'); print(json.dumps({'status': 'failed', 'error': "
        "'TrainingDivergedError', 'message': 'training diverged at epoch 0'})); sys.exit(3)"
    )
    with pytest.raises(TrainingRefusedError, match="TrainingDivergedError: training diverged at epoch 0"):
        run_training_process(["train"], timeout_s=120, program=("-c", script))
    assert issubclass(TrainingRefusedError, PipelineError)
    with pytest.raises(AirflowFailException, match="training diverged at epoch 0"):
        fail_fast_on_bad_data(lambda: run_training_process(["train"], timeout_s=120, program=("-c", script)))
