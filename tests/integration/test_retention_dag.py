"""Retention and erasure in the cluster (dags/enforce_retention.py, dags/erase_customer.py): the Airflow image
has no MLflow, so their models' part runs in a CPU pod of the training image (retention's with the promoter's
identity: it reads the promotion history). Parsed as the DAG processor would under the cluster profile,
rendered as the worker would; the pods' commands read by the training CLI's own parser, and run against a real
registry. Retention's three steps on real data: tests/integration/test_retention.py (`_in_the_cluster`)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import typer
from typer.testing import CliRunner

from core.settings import get_settings
from orchestration import k8s_contract as contract

IMAGE = contract.training_image("registry.example.com", "0.2.0")


def _cluster_dag(monkeypatch, dag_id: str):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_TRAINING__IMAGE", IMAGE)
    get_settings.cache_clear()
    try:
        bag = DagBag(dag_folder=f"dags/{dag_id}.py")
        assert bag.import_errors == {}
        return bag.dags[dag_id]
    finally:
        get_settings.cache_clear()


def _rendered(dag, task_id: str, pulled: dict) -> dict:
    """The training container of the task's pod as the worker renders it, XCom pulls answered by `pulled`."""
    from kubernetes.client import ApiClient

    stand_in = SimpleNamespace(xcom_pull=lambda task_ids: pulled.get(task_ids))
    task = dag.get_task(task_id)
    task.render_template_fields({"ti": stand_in, "dag": dag, "run_id": "manual__x", "params": {}})
    pod = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))
    assert contract.restricted_profile_violations(pod["spec"]) == []
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == contract.TRAINING_CONTAINER]
    assert container["image"] == IMAGE
    return {"service_account": pod["spec"].get("serviceAccountName"), **container}


def _parsed(container: dict) -> dict:
    from training.cli import app

    subcommand, *arguments = container["args"]
    command = typer.main.get_command(app).commands[subcommand]  # the CLI's own parser: nothing runs
    with command.make_context(subcommand, arguments) as parsed:
        return dict(parsed.params)


def test_the_cluster_dag_runs_the_models_part_in_a_promoter_pod_of_the_training_image(monkeypatch):
    dag = _cluster_dag(monkeypatch, "enforce_retention")
    assert dag.get_task("models").upstream_task_ids == {"plan"}
    assert dag.get_task("enforce").upstream_task_ids == {"models"}
    container = _rendered(dag, "models", {"plan": {"newest_ingested": "2026-03-01"}})
    assert container["service_account"] == contract.PROMOTER_SERVICE_ACCOUNT
    assert _parsed(container)["newest"] == "2026-03-01"


def test_the_cluster_erasure_names_the_versions_holding_the_person_from_a_training_pod(monkeypatch):
    dag = _cluster_dag(monkeypatch, "erase_customer")
    assert dag.get_task("models_holding").upstream_task_ids == {"erase"}
    held = {"held_by": {"dataset_revisions": {"ab12": ["training_set"], "cd34": ["gold"]}}}
    container = _rendered(dag, "models_holding", {"erase": held})
    assert container["service_account"] != contract.PROMOTER_SERVICE_ACCOUNT  # it only reads the registry
    assert _parsed(container)["revisions"] == "ab12,cd34"


def test_the_models_steps_read_the_registry_and_refuse_what_they_cannot_read(tmp_path, monkeypatch):
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
        # an erasure's revisions: a version trained on one of them is named, with its aliases
        from mlflow import MlflowClient

        uri = get_settings().mlflow_tracking_uri
        client = MlflowClient(tracking_uri=uri, registry_uri=uri)
        experiment = client.create_experiment("e", artifact_location=(tmp_path / "artifacts").as_uri())
        client.create_registered_model("fraud-detector")
        for rev in ("ab12", "ef56"):
            run = client.create_run(experiment)
            source = f"runs:/{run.info.run_id}/m"
            made = client.create_model_version("fraud-detector", source, run.info.run_id)
            client.set_model_version_tag("fraud-detector", made.version, "lineage.training_set_rev", rev)
        client.set_registered_model_alias("fraud-detector", "champion", "1")
        named = CliRunner().invoke(app, ["trained-on", "--revisions", "ab12,cd34"])
        assert named.exit_code == 0, named.output
        found = json.loads(named.stdout.strip().splitlines()[-1])["model_versions"]
        assert [(v["version"], v["aliases"]) for v in found] == [("1", ["champion"])]
        bad = CliRunner().invoke(app, ["trained-on", "--revisions", "ab12,../x"])
        assert bad.exit_code == 2 and "'../x' is not a DVC revision" in bad.output
    finally:
        get_settings.cache_clear()
