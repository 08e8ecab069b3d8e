"""Retention in the cluster (dags/enforce_retention.py): the Airflow image has no MLflow, so the models'
part runs in a CPU pod of the training image with the promoter's identity (it reads the promotion history).
Parsed as the DAG processor would under the cluster profile, rendered as the worker would; the pod's command
read by the training CLI's own parser, and run against a real (empty) registry. The three steps' outcome on
real data is tests/integration/test_retention.py (`_in_the_cluster`)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import typer
from typer.testing import CliRunner

from core.settings import get_settings
from orchestration import k8s_contract as contract


def test_the_cluster_dag_runs_the_models_part_in_a_promoter_pod_of_the_training_image(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from kubernetes.client import ApiClient

    from training.cli import app

    image = contract.training_image("registry.example.com", "0.2.0")
    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_TRAINING__IMAGE", image)
    get_settings.cache_clear()
    try:
        bag = DagBag(dag_folder="dags/enforce_retention.py")
        assert bag.import_errors == {}
        dag = bag.dags["enforce_retention"]
    finally:
        get_settings.cache_clear()
    assert dag.get_task("models").upstream_task_ids == {"plan"}
    assert dag.get_task("enforce").upstream_task_ids == {"models"}
    planned = {"newest_ingested": "2026-03-01"}
    stand_in = SimpleNamespace(xcom_pull=lambda task_ids: planned if task_ids == "plan" else None)
    task = dag.get_task("models")
    task.render_template_fields({"ti": stand_in, "dag": dag, "run_id": "scheduled__x", "params": {}})
    pod = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))
    assert contract.restricted_profile_violations(pod["spec"]) == []
    assert pod["spec"]["serviceAccountName"] == contract.PROMOTER_SERVICE_ACCOUNT
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == contract.TRAINING_CONTAINER]
    assert container["image"] == image
    subcommand, *arguments = container["args"]
    command = typer.main.get_command(app).commands[subcommand]  # the CLI's own parser: nothing runs
    with command.make_context(subcommand, arguments) as parsed:
        assert parsed.params["newest"] == "2026-03-01"


def test_the_models_step_reads_the_registry_and_refuses_a_date_it_cannot_read(tmp_path, monkeypatch):
    from training.cli import app

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    try:
        get_settings().ensure_dirs()
        done = CliRunner().invoke(app, ["retention-models", "--newest", ""])  # nothing ingested yet
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout.strip().splitlines()[-1]) == {
            "protected_training_sets": [],
            "models": {"artifacts_removed": [], "kept": {}},
        }
        refused = CliRunner().invoke(app, ["retention-models", "--newest", "03/01/2026"])
        assert refused.exit_code == 2 and "'03/01/2026' is not a date" in refused.output
    finally:
        get_settings.cache_clear()
