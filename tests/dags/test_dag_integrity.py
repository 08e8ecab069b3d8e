"""DAG integrity: every DAG file in dags/ is checked here without any test code of its own.

A DAG file must import cleanly, declare an owner, tags, docs, retries and an execution timeout on every
task, and do no work at parse time: no connection, Variable or database access and no heavy imports.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAG_FILES = sorted(p for p in (REPO / "dags").glob("*.py") if not p.name.startswith("_"))
PROBE = Path(__file__).with_name("parse_probe.py")


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


@pytest.fixture(scope="module")
def dagbag():
    return _dagbag()


def test_there_are_dag_files_to_check():
    assert DAG_FILES, "dags/ holds no DAG file"


def test_every_dag_file_imports_without_errors(dagbag):
    assert dagbag.import_errors == {}
    files_with_dags = {Path(dag.fileloc).name for dag in dagbag.dags.values()}
    assert files_with_dags == {p.name for p in DAG_FILES}, "a file in dags/ defines no DAG"


def test_collecting_this_module_parses_no_dag():
    """Its tests are parametrized by file: importing the module (what collection does, for any `-m`
    selection) must not build a DagBag, which costs every run seconds."""
    probe = "import sys, tests.dags.test_dag_integrity; print('airflow.dag_processing.dagbag' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "False"


def check_no_work_at_parse_time(dag_file: Path) -> float:
    """Parse `dag_file` in a probe process; fails naming what it reached out to or imported. Returns the
    seconds its import took."""
    out = subprocess.run(
        [sys.executable, str(PROBE), str(dag_file)], capture_output=True, text=True, cwd=REPO, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["events"] == [], f"{dag_file.name} reached out at parse time: {report['events']}"
    assert report["heavy_modules"] == [], f"{dag_file.name} imports {report['heavy_modules']} at parse time"
    assert report["dag_ids"], f"{dag_file.name} defines no DAG at module level"
    return report["seconds"]


def check_owner_tags_and_docs(dag) -> None:
    assert dag.tags, f"{dag.dag_id}: add tags"
    assert dag.doc_md and len(dag.doc_md.strip()) > 40, f"{dag.dag_id}: add doc_md saying what it does"
    owners = {task.owner for task in dag.tasks}
    assert owners and "airflow" not in owners, f"{dag.dag_id}: set default_args owner to a real team"
    assert dag.max_active_runs is not None


def check_retries_and_timeouts(dag) -> None:
    for task in dag.tasks:
        if hasattr(task, "response_timeout"):  # a person's answer (HITL): not retried, bounded by its timeout
            assert task.retries == 0, f"{dag.dag_id}.{task.task_id}: a human decision is not retried"
            assert isinstance(task.response_timeout, timedelta), (
                f"{dag.dag_id}.{task.task_id}: set response_timeout"
            )
            assert task.response_timeout <= timedelta(days=7), (
                f"{dag.dag_id}.{task.task_id}: timeout too long"
            )
            continue
        assert task.retries >= 1, f"{dag.dag_id}.{task.task_id}: set retries"
        assert isinstance(task.execution_timeout, timedelta), (
            f"{dag.dag_id}.{task.task_id}: set execution_timeout"
        )
        assert task.execution_timeout <= timedelta(days=2), f"{dag.dag_id}.{task.task_id}: timeout too long"


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.name)
def test_dag_file_does_no_work_at_parse_time(dag_file, record_property):
    # the parse time is reported at the end of the run by tests/conftest.py (under xdist too)
    record_property("dag_parse_seconds", check_no_work_at_parse_time(dag_file))


def _dags_of(dagbag, dag_file: Path) -> list:
    """The DAGs `dag_file` defines, from the module's DagBag: the parametrization is by file, known without
    parsing anything, so collecting this module (any `-m` selection) builds no DagBag."""
    dags = sorted(
        (dag for dag in dagbag.dags.values() if Path(dag.fileloc).name == dag_file.name),
        key=lambda d: d.dag_id,
    )
    assert dags, f"{dag_file.name} defines no DAG"
    return dags


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.stem)
def test_dag_declares_owner_tags_and_docs(dagbag, dag_file):
    for dag in _dags_of(dagbag, dag_file):
        check_owner_tags_and_docs(dag)


@pytest.mark.parametrize("dag_file", DAG_FILES, ids=lambda p: p.stem)
def test_every_task_retries_and_has_a_timeout(dagbag, dag_file):
    for dag in _dags_of(dagbag, dag_file):
        check_retries_and_timeouts(dag)


def test_the_online_loads_of_a_features_run_go_one_date_at_a_time(dagbag):
    """Each load reads the stored event times and then writes: two dates at once could put an older value
    over a newer one (a run routinely holds a late event's date beside its arrival's)."""
    assert dagbag.dags["build_features"].task_dict["materialize"].max_active_tis_per_dagrun == 1
