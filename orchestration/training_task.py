"""The retrain DAG's `train` task, per profile: a KubernetesPodOperator on a GPU node (cluster) or the same
command as a local process (local). Both run `python -m training train <arguments>`.

Imported at DAG parse time: it reads only environment-backed settings; the Kubernetes provider and client
models are imported only when the cluster profile builds its operator (no cluster is contacted until the task
runs).
"""

from __future__ import annotations

import copy
import functools
import json
from datetime import timedelta
from typing import Any

from core.settings import Settings
from orchestration import k8s_contract as contract

TRAIN_TASK_ID = "train"
CHECKPOINT_MOUNT = "/checkpoints"
XCOM_RETURN = "/airflow/xcom/return.json"  # where the provider's sidecar collects the XCom
# The provider's XCom sidecar asks for 1m CPU and 10Mi and sets no security context, so the training
# namespace would refuse the whole pod: its LimitRange minimum is 100m/128Mi and Pod Security "restricted"
# wants privilege escalation off and every capability dropped. The sidecar gets the trainer's hardening
# and this: the LimitRange minimum, with limits equal to requests so no default limit is charged to the quota.
XCOM_SIDECAR_RESOURCES = {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "64Mi"}


def train_arguments(
    training_set_rev: str,
    checkpoint_dir: str | None = None,
    dag_id: str = "{{ dag.dag_id }}",
    dag_run_id: str = "{{ run_id }}",
) -> list[str]:
    """The training CLI's arguments. The defaults are Jinja that Airflow renders in the pod's arguments;
    the local task passes its values directly."""
    arguments = [
        "train",
        "--training-set-rev",
        training_set_rev,
        "--dag-id",
        dag_id,
        "--dag-run-id",
        dag_run_id,
    ]
    if checkpoint_dir:
        arguments += ["--checkpoint-dir", checkpoint_dir]
    return arguments


def training_pod_operator(settings: Settings, training_set_rev: str, **operator_args: Any):
    """The cluster profile's train task: the contract's restricted GPU pod, image and namespace from the
    settings, credentials only from a Kubernetes Secret, checkpoints on a volume claim so a retry resumes."""
    from kubernetes.client import models as k8s

    training = settings.training
    arguments = train_arguments(training_set_rev, f"{CHECKPOINT_MOUNT}/{training_set_rev}")
    arguments += ["--xcom-path", XCOM_RETURN]
    execution_timeout = timedelta(minutes=training.execution_timeout_minutes)
    manifest = contract.training_pod_manifest(
        "fraud-train",
        training.image,
        arguments,
        resources=contract.TrainingResources(gpus=training.gpus),
        env={"MLOPS_TRAINING__IMAGE": training.image},
        # The pod's own deadline is Airflow's timeout, so a pod Airflow lost track of stops no later.
        active_deadline_seconds=int(execution_timeout.total_seconds()),
    )
    spec = manifest["spec"]
    trainer = spec["containers"][0]
    spec["nodeSelector"] = dict(training.node_selector)
    spec["tolerations"] = [dict(t) for t in training.tolerations]
    spec["volumes"].append(
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": training.checkpoint_claim}}
    )
    trainer["volumeMounts"].append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})
    return _training_pod_operator_class()(
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
        durable=True,  # a retry reattaches to the running pod (Airflow 3.3's name for reattach_on_restart)
        deferrable=True,
        startup_timeout_seconds=training.startup_timeout_seconds,
        execution_timeout=execution_timeout,
        get_logs=True,
        # The operator's own fields win over the template's, and its default here is "File".
        termination_message_policy=trainer["terminationMessagePolicy"],
        xcom_sidecar_container_security_context=copy.deepcopy(trainer["securityContext"]),
        env_from=[k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=training.credentials_secret))],
        **operator_args,
    )


@functools.cache
def _training_pod_operator_class() -> type:
    """KubernetesPodOperator with the XCom sidecar sized for the training namespace (the operator takes the
    sidecar's resources only from the Kubernetes connection). Built on first use: the provider is a
    seconds-long import that the local profile's DAG parse should not pay."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from airflow.providers.cncf.kubernetes.utils.xcom_sidecar import PodDefaults
    from kubernetes.client import models as k8s

    class TrainingPodOperator(KubernetesPodOperator):
        def build_pod_request_obj(self, context=None, *, dry_run: bool = False):
            pod = super().build_pod_request_obj(context, dry_run=dry_run)
            for container in pod.spec.containers:
                if container.name == PodDefaults.SIDECAR_CONTAINER_NAME:
                    container.resources = k8s.V1ResourceRequirements(
                        requests=dict(XCOM_SIDECAR_RESOURCES), limits=dict(XCOM_SIDECAR_RESOURCES)
                    )
            return pod

    TrainingPodOperator.__qualname__ = "TrainingPodOperator"  # importable by that name: see __getattr__
    return TrainingPodOperator


def __getattr__(name: str) -> Any:
    # `orchestration.training_task.TrainingPodOperator` resolves without importing the provider first.
    if name == "TrainingPodOperator":
        return _training_pod_operator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
