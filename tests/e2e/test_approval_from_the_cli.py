"""A gate pass from a command asks a person too (mlops/approval_request.py): on the shared demo stack, with
approval on for the command, `mlops promote --gate` of the demo's last champion against the first one (put
back by hand) records `awaiting_approval` and starts the approval DAG's run through the candidate event, as
the retrain DAG's ask_approval does; the starter cannot answer, the stack's approver does (through Airflow's
REST API: the browser test answers in the UI), and the version is champion again. No training: the gate of a
version the demo trained, so the test costs a gate and an approval run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import wait_for
from tests.e2e.conftest import at_most_every, mlops_json

APPROVE = "approve_fraud_model"
APPROVER = "risk-officer"  # scripts/up.sh: the stack's approvers group
STARTER = "ml-engineer"
TIMEOUT = 600


def test_a_gate_pass_from_a_command_starts_the_approval_run_and_the_approver_answers_it(demo_stack):
    from airflow_client.client.models.update_hitl_detail_payload import UpdateHITLDetailPayload

    from mlops.airflow_api import AirflowAPI

    promoted = [r for r in demo_stack.summary["retrains"] if r["decision"] == "promoted"]
    first, last = promoted[0]["model_version"], promoted[-1]["model_version"]
    back = mlops_json(demo_stack, "promote", "--version", first, "--reason", "e2e: a candidate to approve")
    assert back["decision"] == "promoted", back

    mlops = str(Path(sys.executable).with_name("mlops"))
    env = {**demo_stack.env, "MLOPS_APPROVAL__ENABLED": "true"}
    done = subprocess.run(
        [mlops, "promote", "--gate", "--version", last, "--actor", STARTER, "--json"],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["decision"] == "awaiting_approval", (json.dumps(record)[:3000], demo_stack.summary["retrains"])
    run_id = record["approval_run"]
    assert run_id, record
    assert f"{APPROVE} run {run_id}" in done.stderr

    approver = AirflowAPI(demo_stack.airflow_url, APPROVER, demo_stack.passwords[APPROVER])
    wait_for(
        at_most_every(
            1, lambda: approver.task_instance(APPROVE, run_id, "approval").state == "awaiting_input"
        ),
        TIMEOUT,
        "the approval task to wait for a person",
    )
    asked = approver.xcom(APPROVE, run_id, "candidate")
    assert asked["model_version"] == last and asked["triggered_by"] == STARTER, asked
    approver.call(
        approver.task_instances_api.update_hitl_detail, APPROVE, run_id, "approval", -1,
        UpdateHITLDetailPayload(chosen_options=["Approve"], params_input={"comment": "e2e: from the CLI"}),
    )  # fmt: skip
    assert approver.wait_for_run(APPROVE, run_id, time.monotonic() + TIMEOUT).state == "success"
    recorded = approver.xcom(APPROVE, run_id, "record_decision")
    assert recorded["decision"] == "promoted" and recorded["decided_by"] == APPROVER, recorded
    history = mlops_json(demo_stack, "history")["history"]
    row = [r for r in history if r["candidate_version"] == last and r["decided_by"] == APPROVER][-1]
    assert row["triggered_by"] == STARTER and row["comment"] == "e2e: from the CLI", row
