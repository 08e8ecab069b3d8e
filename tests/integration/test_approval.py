"""A person's sign-off before a gate pass serves (dags/approve_fraud_model.py, training/registry.py
decide_approval), through Airflow: the approval DAG runs with `dag.test()` while the answer comes as the
Airflow UI sends it, a PATCH of the task's Human-in-the-loop details on Airflow's own REST API (its FastAPI
app in this process, over the same metadata database, with two users of its simple auth manager); the
timeout is the scheduler's own sweep. MLflow and the promotion history on SQLite.

- approve: the version is promoted; the approver and the comment are in the promotion history;
- reject, and no answer in time: nothing is promoted, though the recording task runs whatever the
  approval's outcome (its trigger rule);
- the person who started the retrain run cannot approve it: refused, the task fails, nothing promoted;
  another person can still approve.
"""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import pytest

from core.settings import get_settings
from tests.conftest import wait_for
from tests.integration.conftest import dag_run_states
from tests.integration.test_promotion import POLICY, _log_and_register, _model
from tests.model.tensors import make_split

USERS = {"risk-officer": "r1sk-pw", "ml-engineer": "ml-pw", "analyst": "an-pw"}
APPROVERS = ["risk-officer", "ml-engineer"]  # the approvers group; the analyst is not in it
DAG_ID = "approve_fraud_model"


def simple_auth_with_approvers(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Airflow's simple auth manager with USERS (each an admin of Airflow, as the UI's login), and the
    approvers group APPROVERS in the settings."""
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    monkeypatch.setenv(
        "AIRFLOW__CORE__AUTH_MANAGER",
        "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
    )
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", ",".join(f"{u}:admin" for u in USERS))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    monkeypatch.setenv("MLOPS_APPROVAL__APPROVERS", json.dumps(APPROVERS))


@pytest.fixture
def approval_home(airflow_db, tmp_path, monkeypatch):
    """An installation with champion v1 and v2 (a better model) registered; Airflow's API with two users."""
    from training.ledger import Ledger
    from training.registry import ModelRegistry, promote_manually

    simple_auth_with_approvers(monkeypatch, tmp_path)
    monkeypatch.setenv("MLOPS_APPROVAL__ENABLED", "true")
    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    weaker = _log_and_register(settings.mlflow_tracking_uri, tmp_path / "artifacts", _model(12, 6, tmp_path))
    good = _log_and_register(settings.mlflow_tracking_uri, tmp_path / "artifacts", _model(None, 5, tmp_path))
    ledger = Ledger(settings.promotion_ledger_url)
    promote_manually(registry, ledger, weaker, "the champion before the approval tests")
    data = make_split(4_000, seed=3)
    yield SimpleNamespace(
        settings=settings,
        registry=registry,
        ledger=ledger,
        v1=weaker,
        v2=good,
        holdout=(data.x, data.y.numpy()),
    )
    ledger.dispose()


def _gate(home, triggered_by: str | None = "ml-engineer"):
    from training.registry import promote_with_gate

    x, y = home.holdout
    decision = promote_with_gate(
        home.registry, home.ledger, home.v2, x, y, POLICY, require_approval=True, triggered_by=triggered_by
    )
    assert decision.decision == "awaiting_approval" and home.registry.champion() == home.v1, decision
    return decision


def _api_client():
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    return TestClient(create_app("core,simple-auth-manager"))


def _token(client, user: str) -> str:
    answer = client.post("/auth/token", json={"username": user, "password": USERS[user]})
    assert answer.status_code in (200, 201), answer.text
    return answer.json()["access_token"]


def _awaiting(timeout: float = 120.0, dag_id: str = DAG_ID) -> str:
    """The run id of `dag_id`'s approval task once it waits for input."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    found: dict[str, str] = {}

    def waiting() -> bool:
        with create_session() as session:
            ti = (
                session.query(TaskInstance)
                .filter(TaskInstance.dag_id == dag_id, TaskInstance.task_id == "approval")
                .filter(TaskInstance.state == TaskInstanceState.AWAITING_INPUT)
                .first()
            )
            if ti is not None:
                found["run_id"] = ti.run_id
        return "run_id" in found

    wait_for(waiting, timeout, "the approval task to wait for input")
    return found["run_id"]


def _past_its_deadline(run_id: str) -> bool:
    """Whether the approval task of `run_id` has passed its response deadline (the scheduler's sweep
    resolves only those)."""
    from airflow.models import TaskInstance
    from airflow.utils import timezone
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = (
            session.query(TaskInstance)
            .filter(
                TaskInstance.dag_id == DAG_ID,
                TaskInstance.run_id == run_id,
                TaskInstance.task_id == "approval",
            )
            .one()
        )
        return ti.trigger_timeout is not None and ti.trigger_timeout < timezone.utcnow()


def _run_and_answer(home, answer) -> tuple[dict[str, str], object]:
    """Run the approval DAG for v2 (in this thread: a task runner sets signal handlers); `answer(run_id)`,
    in another thread, responds once the approval task waits."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder="dags").dags[DAG_ID]
    failure: dict = {}

    def respond() -> None:
        try:
            answer(_awaiting())
        except BaseException as exc:  # surfaced in the main thread
            failure["error"] = exc

    responder = threading.Thread(target=respond, daemon=True)
    responder.start()
    run = dag.test(run_conf={"version": home.v2})
    responder.join(timeout=60)
    if "error" in failure:
        raise failure["error"]
    return dag_run_states(run), run


def _respond(
    run_id: str, user: str, choice: str, comment: str, status: int = 200, dag_id: str = DAG_ID
) -> None:
    """`user` answers the approval task of `dag_id`'s run as the Airflow UI does; `status`: Airflow's."""
    client = _api_client()
    headers = {"Authorization": f"Bearer {_token(client, user)}"}
    path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/approval/-1/hitlDetails"
    answered = client.patch(
        path, json={"chosen_options": [choice], "params_input": {"comment": comment}}, headers=headers
    )
    assert answered.status_code == status, answered.text
    if status == 200:
        assert answered.json()["responded_by"]["name"] == user


def _history(home) -> list:
    return home.ledger.history(home.registry.name)


def test_a_rejection_and_no_answer_in_time_promote_nothing(approval_home, monkeypatch):
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

    home = approval_home
    _gate(home)
    states, _ = _run_and_answer(
        home, lambda run_id: _respond(run_id, "risk-officer", "Reject", "recall too low")
    )
    assert states == {"candidate": "success", "approval": "success", "record_decision": "success"}
    assert home.registry.champion() == home.v1
    rejected = _history(home)[-1]
    assert (rejected.action, rejected.decision, rejected.decided_by) == (
        "approval",
        "rejected",
        "risk-officer",
    )
    assert rejected.comment == "recall too low" and rejected.reason.startswith("rejected by risk-officer")

    monkeypatch.setenv("MLOPS_APPROVAL__TIMEOUT_HOURS", str(1 / 3600))  # a second
    get_settings.cache_clear()
    _gate(home)

    def nobody_answers(run_id: str) -> None:
        wait_for(lambda: _past_its_deadline(run_id), 30, "the approval's response deadline")
        SchedulerJobRunner(job=Job()).check_awaiting_input_timeouts()  # the scheduler's sweep

    states, _ = _run_and_answer(home, nobody_answers)
    assert states == {"candidate": "success", "approval": "failed", "record_decision": "success"}
    assert home.registry.champion() == home.v1
    timed_out = _history(home)[-1]
    assert (timed_out.action, timed_out.decision, timed_out.decided_by) == ("approval", "rejected", None)
    assert timed_out.reason.startswith("no decision in time")


def test_the_person_who_started_the_run_cannot_approve_it_nor_a_non_member_and_another_can(
    approval_home, alert_receiver
):
    """The starter (a member of the approvers group) is refused by the ledger; a user outside the group is
    refused by Airflow (403) and, should a request reach it, by the ledger; an approver who did not start
    it approves. Each request alerts the approvers' channel first."""
    home = approval_home
    _gate(home, triggered_by="ml-engineer")
    states, _ = _run_and_answer(
        home, lambda run_id: _respond(run_id, "ml-engineer", "Approve", "mine, looks good")
    )
    assert states == {"candidate": "success", "approval": "success", "record_decision": "failed"}
    assert home.registry.champion() == home.v1
    refused = _history(home)[-1]
    assert (refused.action, refused.decision, refused.decided_by) == ("approval", "refused", "ml-engineer")
    assert "cannot approve it" in refused.reason
    # the request reached the approvers' channel with the gate's figures, before anyone answered
    asked = [p for p in alert_receiver.received.posts if p["kind"] == "approval_requested"]
    assert [p["details"]["model_version"] for p in asked] == [home.v2]
    assert asked[0]["details"]["approvers"] == APPROVERS and "| auc_pr |" in asked[0]["text"]
    assert "who may answer: risk-officer, ml-engineer" in asked[0]["text"]

    # outside the group: the ledger refuses it too (an answer that did not come through Airflow's check)
    from core.errors import PipelineError
    from training import steps

    with pytest.raises(PipelineError, match="analyst is not in the approvers group"):
        steps.approve(get_settings(), home.v2, "Approve", "analyst", "not mine to sign")
    assert (_history(home)[-1].decision, _history(home)[-1].decided_by) == ("refused", "analyst")
    assert home.registry.champion() == home.v1

    def outsider_then_approver(run_id: str) -> None:
        _respond(run_id, "analyst", "Approve", "not mine to sign", status=403)  # Airflow refuses
        _respond(run_id, "risk-officer", "Approve", "MRM-7 signed")

    states, _ = _run_and_answer(home, outsider_then_approver)
    assert states == {"candidate": "success", "approval": "success", "record_decision": "success"}
    assert home.registry.champion() == home.v2
    approved = _history(home)[-1]
    assert (approved.action, approved.decision, approved.champion_after) == ("approval", "promoted", home.v2)
    assert (approved.decided_by, approved.comment, approved.triggered_by) == (
        "risk-officer",
        "MRM-7 signed",
        "ml-engineer",
    )
    assert approved.reason.startswith("approved by risk-officer (MRM-7 signed); the gate said: AUC-PR")


def test_the_cluster_profile_records_the_answer_in_a_restricted_pod_of_the_training_cli(monkeypatch):
    """Parsed as the DAG processor would under the cluster profile, rendered as the worker would: the answer
    task hands the person's choice to `python -m training approve` (the Airflow image has no MLflow)."""
    import typer
    from airflow.dag_processing.dagbag import DagBag
    from kubernetes.client import ApiClient

    from orchestration import k8s_contract as contract
    from training.cli import app

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_TRAINING__IMAGE", contract.training_image("registry.example.com", "0.1.0"))
    get_settings.cache_clear()
    bag = DagBag(dag_folder="dags/approve_fraud_model.py")
    assert bag.import_errors == {}
    dag = bag.dags[DAG_ID]
    recorded = dag.get_task("record_decision")
    assert recorded.upstream_task_ids == {"answer"} and dag.get_task("answer").trigger_rule == "all_done"
    answered = {
        "version": "7", "choice": "Approve", "decided_by": "risk-officer", "comment": "MRM-7; ok",
        "started_by": "",
    }  # fmt: skip
    stand_in = SimpleNamespace(xcom_pull=lambda task_ids: answered if task_ids == "answer" else None)
    recorded.render_template_fields({"ti": stand_in, "dag": dag, "run_id": "asset_triggered__x"})
    pod = ApiClient().sanitize_for_serialization(recorded.build_pod_request_obj(dry_run=True))
    assert contract.restricted_profile_violations(pod["spec"]) == []
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == contract.TRAINING_CONTAINER]
    subcommand, *arguments = container["args"]
    assert subcommand == "approve"
    command = typer.main.get_command(app).commands[subcommand]  # the CLI's own parser: nothing runs
    with command.make_context(subcommand, arguments) as context:
        assert (context.params["version"], context.params["choice"]) == ("7", "Approve")
        assert (context.params["decided_by"], context.params["comment"]) == ("risk-officer", "MRM-7; ok")
        assert context.params["dag_run_id"] == "asset_triggered__x"


def test_with_approval_on_only_an_approver_promotes_by_hand(approval_home):
    """A promotion by hand is a sign-off: with approval on, `mlops promote` by anyone outside the approvers
    group is refused before anything is recorded (they use `--gate`, whose pass waits for an approver)."""
    from training import steps
    from training.registry import PromotionError

    home = approval_home
    before = len(home.ledger.history(home.registry.name))
    with pytest.raises(PromotionError) as refused:
        steps.promote_by_hand(home.settings, home.v2, "no time to wait", actor="analyst")
    assert "only the approvers group (risk-officer, ml-engineer)" in str(refused.value)
    assert f"mlops promote --gate --version {home.v2}" in str(refused.value)
    assert len(home.ledger.history(home.registry.name)) == before and home.registry.champion() == home.v1
    done = steps.promote_by_hand(home.settings, home.v2, "signed off by hand", actor="risk-officer")
    assert done["decision"] == "promoted" and home.registry.champion() == home.v2
