"""One switch decides where every DAG's heavy steps run: `training.runner` (Settings.training_runner), never
the profile on its own. The monitor DAG once switched on the profile, so with the local runner in the cluster
profile monitoring still launched pods. Each DAG folder is parsed in a process of its own, as Airflow's DAG
processor parses it, under both mismatched combinations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json
from airflow.dag_processing.dagbag import DagBag

bag = DagBag(dag_folder="dags")
pods = {
    dag.dag_id: sorted(
        t.task_id for t in dag.tasks if any(c.__name__ == "KubernetesPodOperator" for c in type(t).__mro__)
    )
    for dag in bag.dags.values()
}
print(json.dumps({"errors": {k: v[-500:] for k, v in bag.import_errors.items()}, "pods": pods}))
"""
# Every DAG that launches pods with the kubernetes runner, and the tasks that do.
POD_TASKS = {
    "retrain_fraud_model": {
        *("skip_identical", "train", "evaluate", "register", "promote", "export", "compress"),
    },
    "approve_fraud_model": {"record_decision"},
    "monitor_fraud_model": {"check"},
    "tune_fraud_model": {"start_study", "finish_study"},
    "score_fraud_batch": {"score"},
    "reproduce_fraud_model": {"resolve_image", "reproduce"},
    "enforce_retention": {"models"},
    "erase_customer": {"models_holding"},
}


def _pods(profile: str, runner: str) -> dict[str, set[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLOPS_")}
    env |= {"MLOPS_PROFILE": profile, "MLOPS_TRAINING__RUNNER": runner}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    return {dag_id: set(tasks) for dag_id, tasks in report["pods"].items() if tasks}


def test_the_local_runner_launches_no_pod_in_the_cluster_profile():
    assert _pods("cluster", "local") == {}


def test_the_kubernetes_runner_launches_the_same_pods_in_either_profile():
    assert _pods("local", "kubernetes") == POD_TASKS
