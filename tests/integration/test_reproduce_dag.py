"""Reproduce in the cluster (dags/reproduce_fraud_model.py): the image a version was trained in, by digest, as
the training CLI reads it from a real registry (MLflow on SQLite), and the two pods the DAG renders under the
cluster profile: the resolver in the deployment's training image, the rebuild in the version's own image by
digest whatever tag runs now, with the recorded tag for its identity check."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from core.settings import get_settings
from orchestration import k8s_contract as contract

DIGEST = "sha256:" + "ab" * 32
TRAINED_IN = contract.training_image("registry.example.com", "0.1.0")


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry with v1 trained in a pod (its image id and digest recorded) and v2 trained locally."""
    from mlflow import MlflowClient

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    # registry_uri too: unset, MLflow takes the process's global one, which an earlier test may have set
    client = MlflowClient(
        tracking_uri=settings.mlflow_tracking_uri, registry_uri=settings.mlflow_tracking_uri
    )
    experiment = client.create_experiment("e", artifact_location=(tmp_path / "artifacts").as_uri())
    client.create_registered_model("fraud-detector")
    images = (
        {"lineage.image": TRAINED_IN, "lineage.image_id": f"{TRAINED_IN.rsplit(':', 1)[0]}@{DIGEST}",
         "lineage.image_digest": DIGEST},
        {"lineage.image": "local"},
    )  # fmt: skip
    for tags in images:
        run = client.create_run(experiment)
        lineage = {
            "lineage.training_set_rev": "0" * 16,
            "lineage.git_commit": "c" * 40,
            "lineage.as_of": "2026-01-02",
        }
        for key, value in {**lineage, **tags}.items():
            client.set_tag(run.info.run_id, key, value)
        client.create_model_version("fraud-detector", f"runs:/{run.info.run_id}/model", run.info.run_id)
    yield settings
    get_settings.cache_clear()


def test_the_image_a_version_was_trained_in_is_resolved_by_digest_and_a_local_one_is_refused(registry):
    from training.cli import app

    done = CliRunner().invoke(app, ["resolve-image", "--version", "1"])
    assert done.exit_code == 0, done.output
    resolved = json.loads(done.stdout.strip().splitlines()[-1])
    assert resolved["image"] == f"registry.example.com/{contract.TRAINING_IMAGE_REPOSITORY}@{DIGEST}"
    assert resolved["image_tag"] == TRAINED_IN and resolved["git_commit"] == "c" * 40

    refused = CliRunner().invoke(app, ["resolve-image", "--version", "2"])
    assert refused.exit_code != 0
    assert "v2 recorded no image digest" in str(refused.exception) and "c" * 40 in str(refused.exception)


def test_the_cluster_dag_rebuilds_in_the_versions_own_image_by_digest(monkeypatch):
    """Parsed as the DAG processor would under the cluster profile, rendered as the worker would."""
    from airflow.dag_processing.dagbag import DagBag
    from kubernetes.client import ApiClient

    from training.cli import app

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_TRAINING__IMAGE", contract.training_image("registry.example.com", "0.2.0"))
    get_settings.cache_clear()
    try:
        bag = DagBag(dag_folder="dags/reproduce_fraud_model.py")
        assert bag.import_errors == {}
        dag = bag.dags["reproduce_fraud_model"]
    finally:
        get_settings.cache_clear()
    assert dag.get_task("reproduce").upstream_task_ids == {"resolve_image"}
    resolved = {"image": f"registry.example.com/mlops-fraud-training@{DIGEST}", "image_tag": TRAINED_IN}
    stand_in = SimpleNamespace(xcom_pull=lambda task_ids: resolved if task_ids == "resolve_image" else None)
    context = {
        "ti": stand_in,
        "dag": dag,
        "run_id": "manual__x",
        "params": {"version": "7", "tolerance": 0.02},
    }
    pods = {}
    for task_id in ("resolve_image", "reproduce"):
        task = dag.get_task(task_id)
        task.render_template_fields(context)
        pod = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))
        assert contract.restricted_profile_violations(pod["spec"]) == []
        (pods[task_id],) = [c for c in pod["spec"]["containers"] if c["name"] == contract.TRAINING_CONTAINER]
    # the resolver runs the deployment's image; the rebuild the version's own, by digest
    assert pods["resolve_image"]["image"] == contract.training_image("registry.example.com", "0.2.0")
    assert pods["reproduce"]["image"] == resolved["image"]
    for task_id, container in pods.items():
        subcommand, *arguments = container["args"]
        command = typer.main.get_command(app).commands[subcommand]  # the CLI's own parser: nothing runs
        with command.make_context(subcommand, arguments) as parsed:
            assert parsed.params["version"] == "7", task_id
            if subcommand == "reproduce":
                assert (parsed.params["image"], parsed.params["tolerance"]) == (TRAINED_IN, 0.02)
