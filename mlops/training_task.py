"""The retrain DAG's `train` task, per profile: a KubernetesPodOperator on a GPU node (cluster) or the same
command as a local process (local). Both run `python -m training train <arguments>`.

Imported at DAG parse time: it reads only environment-backed settings and imports the Kubernetes provider
and client models (no cluster is contacted until the task runs).
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from mlops import k8s_contract as contract
from mlops.settings import Settings

TRAIN_TASK_ID = "train"
CHECKPOINT_MOUNT = "/checkpoints"
XCOM_RETURN = "/airflow/xcom/return.json"  # where the provider's sidecar collects the XCom


def train_arguments(training_set_rev: str, checkpoint_dir: str | None = None) -> list[str]:
    """The training CLI's arguments (templated: Airflow renders the Jinja before the command runs)."""
    arguments = [
        "train",
        "--training-set-rev",
        training_set_rev,
        "--dag-id",
        "{{ dag.dag_id }}",
        "--dag-run-id",
        "{{ run_id }}",
    ]
    if checkpoint_dir:
        arguments += ["--checkpoint-dir", checkpoint_dir]
    return arguments


def training_pod_operator(settings: Settings, training_set_rev: str, **operator_args: Any):
    """The cluster profile's train task: the contract's restricted GPU pod, image and namespace from the
    settings, credentials only from a Kubernetes Secret, checkpoints on a volume claim so a retry resumes."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from kubernetes.client import models as k8s

    training = settings.training
    arguments = train_arguments(training_set_rev, f"{CHECKPOINT_MOUNT}/{training_set_rev}")
    arguments += ["--xcom-path", XCOM_RETURN]
    manifest = contract.training_pod_manifest(
        "fraud-train",
        training.image,
        arguments,
        resources=contract.TrainingResources(gpus=training.gpus),
        env={"MLOPS_TRAINING__IMAGE": training.image},
    )
    spec = manifest["spec"]
    spec["nodeSelector"] = dict(training.node_selector)
    spec["tolerations"] = [dict(t) for t in training.tolerations]
    spec["volumes"].append(
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": training.checkpoint_claim}}
    )
    spec["containers"][0]["volumeMounts"].append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
    return KubernetesPodOperator(
        task_id=TRAIN_TASK_ID,
        namespace=settings.cluster.kubernetes_namespace,
        image=training.image,
        cmds=list(contract.TRAINING_COMMAND),
        arguments=arguments,
        pod_template_dict=manifest,
        base_container_name=contract.TRAINING_CONTAINER,
        name="fraud-train",
        random_name_suffix=True,
        do_xcom_push=True,  # the run id comes back through /airflow/xcom/return.json
        on_finish_action="delete_pod",
        reattach_on_restart=True,
        deferrable=True,
        startup_timeout_seconds=training.startup_timeout_seconds,
        execution_timeout=timedelta(minutes=training.execution_timeout_minutes),
        get_logs=True,
        env_from=[k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=training.credentials_secret))],
        **operator_args,
    )


def run_training_process(arguments: list[str]) -> dict:
    """The local profile's train task: the same CLI as a child process; its last stdout line is the result."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "training", *arguments], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(
            f"`python -m training {' '.join(arguments)}` exited {done.returncode}:\n{done.stderr[-4000:]}"
        )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"`python -m training {' '.join(arguments)}` printed no result")
    return json.loads(lines[-1])
