"""Airflow's REST API through the official client (`apache-airflow-client`) against the running api-server of
the shared `demo_stack`: the login is enforced, and a retrain triggered by hand runs to success and goes
through the gate."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.e2e.conftest import DAG_IDS, DEMO_DATES

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


def test_a_retrain_triggered_through_the_rest_api_runs_to_success(api_client):
    from airflow_client.client.api.dag_run_api import DagRunApi
    from airflow_client.client.api.task_instance_api import TaskInstanceApi
    from airflow_client.client.api.x_com_api import XComApi
    from airflow_client.client.models.trigger_dag_run_post_body import TriggerDAGRunPostBody

    runs = DagRunApi(api_client)
    as_of = DEMO_DATES[-1].isoformat()
    run = runs.trigger_dag_run(
        RETRAIN, TriggerDAGRunPostBody(logical_date=None, conf={"as_of": as_of}, note="e2e: REST API")
    )
    assert run.run_type == "manual" and run.conf == {"as_of": as_of}

    deadline = time.monotonic() + RUN_TIMEOUT
    while (state := runs.get_dag_run(RETRAIN, run.dag_run_id).state) not in ("success", "failed"):
        assert time.monotonic() < deadline, f"{RETRAIN} {run.dag_run_id} still {state} after {RUN_TIMEOUT}s"
        time.sleep(3)

    instances = TaskInstanceApi(api_client).get_task_instances(RETRAIN, run.dag_run_id).task_instances
    states = {ti.task_id: ti.state for ti in instances}
    assert state == "success", states
    assert set(states.values()) == {"success"}, states
    xcoms = XComApi(api_client)

    def xcom(task_id: str):
        entry = xcoms.get_xcom_entry(
            dag_id=RETRAIN, dag_run_id=run.dag_run_id, task_id=task_id, xcom_key="return_value"
        )
        return entry.actual_instance.value  # the API answers one of two schemas (native or string value)

    assert xcom("as_of_date") == as_of
    decision = xcom("promote")
    assert decision["decision"] in {"promoted", "rejected"} and decision["reason"]
    assert int(decision["model_version"]) >= 3  # the demo registered two before it
