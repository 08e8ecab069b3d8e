"""The tuning DAG as the cluster profile builds it, checked without a cluster: each trial slot is a mapped
GPU pod of the training image (restricted, the checkpoint claim mounted where the arguments point, at most
`tuning.parallelism` at a time), whose arguments the training CLI itself accepts; the study's start and finish
are CPU pods of the same image."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.settings import get_settings
from orchestration import k8s_contract as contract
from orchestration.training_task import CHECKPOINT_MOUNT
from tests.integration.conftest import REPO, schema_errors

DAG_FILE = REPO / "dags" / "tune_fraud_model.py"
IMAGE = contract.training_image("registry.example.com", "0.1.0")
STUDY = "fraud-mlp-2026-01-03"


class StandInTaskInstance:
    def xcom_pull(self, task_ids: str) -> Any:
        answers = {
            "start_study": {"study": STUDY},
            "training_set": {"training_set_rev": "9c4e2f1a"},
            "as_of_date": "2026-01-03",
        }
        return answers[task_ids]


@pytest.fixture(scope="module")
def dag():
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLOPS_PROFILE", "cluster")
        patch.setenv("MLOPS_TRAINING__IMAGE", IMAGE)
        patch.setenv("MLOPS_TUNING__TRIALS", "5")
        patch.setenv("MLOPS_TUNING__PARALLELISM", "3")
        get_settings.cache_clear()
        try:
            bag = DagBag(dag_folder=str(DAG_FILE))
        finally:
            get_settings.cache_clear()
    assert bag.import_errors == {} and bag.captured_warnings == {}
    return bag.dags["tune_fraud_model"]


def _pod(operator, dag) -> dict[str, Any]:
    from kubernetes.client import ApiClient

    operator.render_template_fields({"ti": StandInTaskInstance(), "dag": dag, "run_id": "manual__1"})
    return ApiClient().sanitize_for_serialization(operator.build_pod_request_obj(dry_run=True))


@pytest.fixture(scope="module")
def trial_pods(dag) -> list[dict[str, Any]]:
    mapped = dag.get_task("trial")
    return [_pod(mapped.unmap({"arguments": a}), dag) for a in mapped.expand_input.value["arguments"]]


def test_one_trial_pod_per_slot_at_most_parallelism_at_a_time(dag, trial_pods):
    mapped = dag.get_task("trial")
    assert mapped.max_active_tis_per_dagrun == 3
    slots = [pod["spec"]["containers"][0]["args"][4] for pod in trial_pods]
    assert slots == ["0", "1", "2", "3", "4"]
    assert dag.get_task("start_study").downstream_task_ids == {"trial"}
    assert dag.get_task("finish_study").trigger_rule == "none_skipped"


def test_a_trial_pod_is_a_restricted_gpu_pod_of_the_training_image_with_its_checkpoints_on_the_claim(
    infra_tools, trial_pods
):
    settings = get_settings()
    pod = trial_pods[0]
    assert schema_errors(infra_tools, [pod]) == []
    spec = pod["spec"]
    assert contract.restricted_profile_violations(spec) == []
    trainer = spec["containers"][0]
    assert trainer["image"] == IMAGE
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["nodeSelector"] == settings.training.node_selector
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"]
        for v in spec["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert claims["checkpoints"] == settings.training.checkpoint_claim
    assert {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT} in trainer["volumeMounts"]


def test_the_training_cli_accepts_each_trial_and_study_pods_arguments(dag, trial_pods):
    import typer

    from training.cli import app

    def parsed(arguments: list[str]) -> dict[str, Any]:
        subcommand, *rest = arguments
        command = typer.main.get_command(app).commands[subcommand]
        with command.make_context(subcommand, rest) as context:
            return context.params

    for slot, pod in enumerate(trial_pods):
        params = parsed(pod["spec"]["containers"][0]["args"])
        assert params["study"] == STUDY and params["slot"] == slot
        assert params["checkpoint_dir"] == Path(f"{CHECKPOINT_MOUNT}/tuning")
        assert params["xcom_path"] is None  # the result goes to the pod results table
    start = parsed(_pod(dag.get_task("start_study"), dag)["spec"]["containers"][0]["args"])
    assert start["as_of"] == "2026-01-03" and start["training_set_rev"] == "9c4e2f1a"
    finish = parsed(_pod(dag.get_task("finish_study"), dag)["spec"]["containers"][0]["args"])
    assert finish["study"] == STUDY
