"""Airflow's REST API through the official client (`apache-airflow-client`) against the running api-server of
the shared `demo_stack`: the login is enforced, and a retrain triggered by hand runs to success and goes
through the gate."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import DAG_IDS, DEMO_DATES, at_most_every
from tests.gate_rule import decision_by_auc_pr
from training.registry import GatePolicy

RETRAIN = "retrain_fraud_model"
RUN_TIMEOUT = 900


@pytest.fixture
def api_client(demo_stack):
    import airflow_client.client as airflow_client

    configuration = airflow_client.Configuration(host=demo_stack.airflow_url, access_token=demo_stack.token())
    with airflow_client.ApiClient(configuration) as client:
        yield client


def test_the_api_wants_a_token_and_the_login_gives_one(demo_stack):
    url = demo_stack.airflow_url
    wrong = httpx.post(f"{url}/auth/token", json={"username": demo_stack.username, "password": "wrong"})
    assert wrong.status_code == 401
    assert httpx.get(f"{url}/api/v2/dags").status_code == 401
    assert demo_stack.token()


def test_the_client_lists_the_dags_without_import_errors(api_client):
    from airflow_client.client.api.dag_api import DAGApi
    from airflow_client.client.api.import_error_api import ImportErrorApi

    dags = DAGApi(api_client).get_dags(limit=100)
    assert {dag.dag_id for dag in dags.dags} == DAG_IDS
    assert ImportErrorApi(api_client).get_import_errors().total_entries == 0


def test_a_retrain_triggered_through_the_rest_api_runs_to_success(api_client, demo_stack):
    from airflow_client.client.api.dag_run_api import DagRunApi
    from airflow_client.client.api.task_instance_api import TaskInstanceApi
    from airflow_client.client.api.x_com_api import XComApi
    from airflow_client.client.models.trigger_dag_run_post_body import TriggerDAGRunPostBody

    runs = DagRunApi(api_client)
    as_of = DEMO_DATES[-1].isoformat()
    run = runs.trigger_dag_run(
        RETRAIN,
        TriggerDAGRunPostBody(logical_date=None, conf={"as_of": as_of, "force": True}, note="e2e: REST API"),
    )
    assert run.run_type == "manual" and run.conf == {"as_of": as_of, "force": True}

    def finished() -> bool:
        return runs.get_dag_run(RETRAIN, run.dag_run_id).state in ("success", "failed")

    wait_for(at_most_every(3, finished), RUN_TIMEOUT, f"{RETRAIN} {run.dag_run_id} to finish")
    state = runs.get_dag_run(RETRAIN, run.dag_run_id).state

    instances = TaskInstanceApi(api_client).get_task_instances(RETRAIN, run.dag_run_id).task_instances
    states = {ti.task_id: ti.state for ti in instances}
    assert state == "success", states
    # trained although identical to the champion (the `force` param); approval is off: ask_approval skips;
    # the gate rejects it (below), so compress makes no variants for it and skips
    skipped = {task: states.pop(task) for task in ("ask_approval", "compress")}
    assert skipped == {"ask_approval": "skipped", "compress": "skipped"}, skipped
    assert set(states.values()) == {"success"}, states
    xcoms = XComApi(api_client)

    def xcom(task_id: str):
        entry = xcoms.get_xcom_entry(
            dag_id=RETRAIN, dag_run_id=run.dag_run_id, task_id=task_id, xcom_key="return_value"
        )
        return entry.actual_instance.value  # the API answers one of two schemas (native or string value)

    assert xcom("as_of_date") == as_of
    decision = xcom("promote")
    # The demo's champion was trained as of this date (a later day's arrival leaves its training set as it
    # was): the same training set, the same model, which cannot beat itself by the margin.
    assert xcom("skip_identical")["forced"] is True
    champion = [r for r in demo_stack.summary["retrains"] if r["decision"] == "promoted"][-1]
    assert champion["as_of"] == as_of
    assert xcom("training_set")["training_set_rev"] == champion["training_set_rev"]
    assert decision["auc_pr"] == decision["champion_auc_pr"] == champion["auc_pr"]
    policy = GatePolicy(floor=float(demo_stack.env["MLOPS_GATE__FLOOR"]))
    expected = decision_by_auc_pr(decision["auc_pr"], decision["champion_auc_pr"], policy)
    assert decision["decision"] == expected == "rejected" and decision["reason"], decision
    assert decision["champion_version"] == decision["previous_champion"] == champion["model_version"]
    assert int(decision["model_version"]) >= 3  # the demo registered two before it
