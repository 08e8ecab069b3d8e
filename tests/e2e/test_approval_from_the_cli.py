"""A gate pass from a command asks a person too (mlops/approval_request.py): on the shared demo stack, with
approval on for the command, `mlops retrain` as of the demo's last day (forced: the demo trained that set
already) against the demo's first champion, put back by hand, records `awaiting_approval` and starts the
approval DAG's run through the candidate event, as the retrain DAG's ask_approval does; the command's user
cannot answer, the stack's approver does (through Airflow's REST API: the browser test answers in the UI),
and the candidate becomes the champion. Cost: the shared demo stack (`demo_stack`, paid once for every e2e
test on it) plus one retrain of the demo's 3-day feed in process and one approval run, about 2 minutes here;
gating a version the demo made would save the training, but whether one passes again depends on the demo's
own decisions, where a retrain as of the last day against the first champion passes (the browser test relies
on the same)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.e2e.conftest import DEMO_DATES, at_most_every, mlops_json

APPROVE = "approve_fraud_model"
APPROVER = "risk-officer"  # scripts/up.sh: the stack's approvers group
STARTER = "ml-engineer"
TIMEOUT = 600


@pytest.mark.moves_champion
def test_a_gate_pass_from_a_command_starts_the_approval_run_and_the_approver_answers_it(demo_stack):
    from airflow_client.client.models.update_hitl_detail_payload import UpdateHITLDetailPayload

    from mlops.airflow_api import AirflowAPI

    promoted = [r for r in demo_stack.summary["retrains"] if r["decision"] == "promoted"]
    first = promoted[0]["model_version"]
    back = mlops_json(demo_stack, "promote", "--version", first, "--reason", "e2e: a candidate to approve")
    assert back["decision"] == "promoted", back

    mlops = str(Path(sys.executable).with_name("mlops"))
    env = {**demo_stack.env, "MLOPS_APPROVAL__ENABLED": "true"}
    command = ["retrain", "--date", DEMO_DATES[-1].isoformat(), "--force", "--actor", STARTER, "--json"]
    done = subprocess.run([mlops, *command], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    retrains = [
        (r.get("as_of"), r.get("model_version"), r.get("decision"), r.get("auc_pr"), r.get("champion_auc_pr"))
        for r in demo_stack.summary["retrains"]
    ]
    assert record["decision"] == "awaiting_approval", (record.get("reason"), record.get("auc_pr"), retrains)
    candidate = record["model_version"]
    run_id = record["approval_run"]
    assert run_id, record
    assert f"{APPROVE} run {run_id}" in " ".join(done.stderr.split())  # said, wherever the console wrapped

    approver = AirflowAPI(demo_stack.airflow_url, APPROVER, demo_stack.passwords[APPROVER])
    wait_for(
        at_most_every(
            1, lambda: approver.task_instance(APPROVE, run_id, "approval").state == "awaiting_input"
        ),
        TIMEOUT,
        "the approval task to wait for a person",
    )
    asked = approver.xcom(APPROVE, run_id, "candidate")
    assert asked["model_version"] == candidate and asked["triggered_by"] == STARTER, asked
    approver.call(
        approver.task_instances_api.update_hitl_detail, APPROVE, run_id, "approval", -1,
        UpdateHITLDetailPayload(chosen_options=["Approve"], params_input={"comment": "e2e: from the CLI"}),
    )  # fmt: skip
    assert approver.wait_for_run(APPROVE, run_id, time.monotonic() + TIMEOUT).state == "success"
    recorded = approver.xcom(APPROVE, run_id, "record_decision")
    assert recorded["decision"] == "promoted" and recorded["decided_by"] == APPROVER, recorded
    history = mlops_json(demo_stack, "history")["history"]
    row = [r for r in history if r["candidate_version"] == candidate and r["decided_by"] == APPROVER][-1]
    assert row["triggered_by"] == STARTER and row["comment"] == "e2e: from the CLI", row
