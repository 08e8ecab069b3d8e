"""Erasure on request through Airflow, once a person approves (dags/erase_customer.py, mlops/erasure.py):
the DAG runs with `dag.test()` on a copy of the reference lake while the answer comes as the Airflow UI sends
it (a PATCH of the approval task's Human-in-the-loop details on Airflow's own REST API, with the approvers and
an outsider as users of its simple auth manager), as in test_approval.py. Gold is not rebuilt here (`rebuild`
off: no Spark); the erasure itself through every layer is tests/integration/test_privacy.py's.

- a refusal erases nothing (the erase task is skipped); the request reached the alert channel, not the id;
- an outsider is refused by Airflow (403); an approver's Erase removes the customer's rows and the report is
  the task's result;
- an id that is not one fails the request before anyone is asked.
"""

from __future__ import annotations

import json
import threading

import pytest

from core.settings import get_settings
from tests import lake as reference
from tests.integration.conftest import dag_run_states
from tests.integration.test_approval import APPROVERS, _awaiting, _respond, simple_auth_with_approvers
from tests.integration.test_feed_week import _xcom

DAG_ID = "erase_customer"


@pytest.fixture
def erase_home(airflow_db, tmp_path, monkeypatch):
    """A copy of the reference lake as MLOPS_HOME; Airflow's API with the approvers and an analyst."""
    home = reference.reference_lake(tmp_path / "home").home
    simple_auth_with_approvers(monkeypatch, tmp_path)
    monkeypatch.setenv("MLOPS_HOME", str(home))
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def _customer_lines(settings, customer: str) -> int:
    """Lines of the landing's transactions files that name `customer` (every format the generator writes)."""
    import gzip

    count = 0
    for path in sorted(settings.landing.glob("*/transactions-*")):
        with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as handle:
            count += sum(1 for line in handle if customer in line)
    return count


def _a_customer(settings) -> str:
    """The first customer id (`c` and seven digits, as the generator writes them) of the first arrival."""
    import gzip
    import re

    ids: set[str] = set()
    for path in sorted(settings.landing.glob(f"{min(reference.DAYS)}/transactions-*")):
        with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as handle:
            ids |= set(re.findall(r"\bc\d{7}\b", handle.read()))
    return sorted(ids)[0]


def _run(conf: dict, answer) -> dict[str, str]:
    """Run the DAG with `conf` (in this thread: a task runner sets signal handlers); `answer(run_id)`, in
    another thread, responds once the approval waits. The tasks' states."""
    # What either thread imports, imported here first: two threads importing Airflow's models at once can
    # deadlock on the import locks (its modules import each other).
    import airflow.api_fastapi.app
    import airflow.models.dagbag
    import airflow.providers.standard.operators.trigger_dagrun  # noqa: F401
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models import TaskInstance  # noqa: F401

    dag = DagBag(dag_folder="dags").dags[DAG_ID]
    failure: dict = {}

    def respond() -> None:
        try:
            answer(_awaiting(dag_id=DAG_ID))
        except BaseException as exc:  # surfaced in the main thread
            failure["error"] = exc

    responder = threading.Thread(target=respond, daemon=True)
    responder.start()
    run = dag.test(run_conf=conf)
    responder.join(timeout=60)
    if "error" in failure:
        raise failure["error"]
    return dag_run_states(run), run


def test_a_refusal_erases_nothing_and_an_approvers_erase_does(erase_home, alert_receiver):
    settings = erase_home
    customer = _a_customer(settings)
    lines = _customer_lines(settings, customer)
    assert lines > 0
    conf = {"customer": customer, "request": "DSR-1042", "rebuild": False}

    states, _ = _run(
        conf, lambda run_id: _respond(run_id, "risk-officer", "Refuse", "not verified", dag_id=DAG_ID)
    )
    assert states == {"request": "success", "approval": "success", "erase": "skipped"}
    assert _customer_lines(settings, customer) == lines
    # the approvers heard of it: the reference, who may answer; never the id
    (asked,) = [p for p in alert_receiver.received.posts if p["kind"] == "erasure_requested"]
    assert asked["details"]["request"] == "DSR-1042" and asked["details"]["approvers"] == APPROVERS
    assert customer not in json.dumps(asked)

    def outsider_then_approver(run_id: str) -> None:
        _respond(run_id, "analyst", "Erase", "mine to do", status=403, dag_id=DAG_ID)  # Airflow refuses
        _respond(run_id, "risk-officer", "Erase", "identity verified", dag_id=DAG_ID)

    states, run = _run(conf, outsider_then_approver)
    assert states == {"request": "success", "approval": "success", "erase": "success"}
    assert _customer_lines(settings, customer) == 0
    report = _xcom(DAG_ID, run.run_id, "erase")
    assert (report["decided_by"], report["comment"], report["request"]) == (
        "risk-officer",
        "identity verified",
        "DSR-1042",
    )
    assert sum(report["landing"].values()) == lines and report["rebuilt"] == {}


def test_an_id_that_is_not_one_fails_before_anyone_is_asked(erase_home):
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder="dags").dags[DAG_ID]
    run = dag.test(run_conf={"customer": "c1; rm -rf /", "request": "DSR-1"})
    assert dag_run_states(run)["request"] == "failed"
    assert dag_run_states(run)["approval"] == "upstream_failed"
