"""The retrain DAG's `train` task, per profile: a KubernetesPodOperator on a GPU node (cluster) or the same
command as a local process (local). Both run `python -m training train <arguments>`.

Imported at DAG parse time: it reads only environment-backed settings; the Kubernetes provider and client
models are imported only when the cluster profile builds its operator (no cluster is contacted until the task
runs).
"""

from __future__ import annotations

import functools
import json
import os
import signal
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from core.errors import EXIT_PIPELINE_ERROR, PipelineError
from core.settings import Settings, settings_as_env
from orchestration import k8s_contract as contract

if TYPE_CHECKING:
    import subprocess
    from types import FrameType

TRAIN_TASK_ID = "train"
CHECKPOINT_MOUNT = "/checkpoints"
# How long a stopped local training process group gets between SIGTERM and SIGKILL (a checkpoint write).
TERMINATE_GRACE_S = 30.0


class TrainingProcessError(RuntimeError):
    """The local training process failed, ran past its timeout, or was stopped with its task."""


class TrainingRefusedError(PipelineError):
    """The training process stopped on a data or divergence error (exit EXIT_PIPELINE_ERROR): a retry with
    the same inputs ends the same way, so the task fails without retries."""


TRAINING_SET_SECONDS = "{{ ti.xcom_pull(task_ids='training_set')['seconds'] }}"


def train_arguments(
    training_set_rev: str,
    checkpoint_dir: str | None = None,
    dag_id: str = "{{ dag.dag_id }}",
    dag_run_id: str = "{{ run_id }}",
    training_set_seconds: str = TRAINING_SET_SECONDS,
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
        "--training-set-seconds",
        training_set_seconds,
    ]
    if checkpoint_dir:
        arguments += ["--checkpoint-dir", checkpoint_dir]
    return arguments


def pod_environment(settings: Settings) -> dict[str, str]:
    """The environment of a pod in the training image: every setting of the task that launches it, written
    out (so the pod reads the same settings, not its image's defaults), except the credentials, which come
    from the Secret (`training.credentials_secret`, or the promoter's; its name is the launcher's business,
    not the pod's),
    and the landing zone, which no training step reads. MLOPS_HOME is where the pod mounts the shared
    volume (the contract's DATA_MOUNT)."""
    env = settings_as_env(settings)
    env.pop("MLOPS_LANDING_DIR", None)
    env.pop("MLOPS_TRAINING__CREDENTIALS_SECRET", None)
    env.pop("MLOPS_TRAINING__PROMOTION_CREDENTIALS_SECRET", None)
    env["MLOPS_HOME"] = contract.DATA_MOUNT
    # Loading a model never unpickles (training/artifacts.py); MLflow reads this before our code can.
    env["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] = "false"
    return env


def training_pod_operator(settings: Settings, training_set_rev: str, **operator_args: Any):
    """The cluster profile's train task: the contract's restricted GPU pod, image and namespace from the
    settings, credentials only from a Kubernetes Secret, the shared volume read-only, checkpoints on a volume
    claim so a retry resumes, torchrun when the pod has more than one GPU."""
    training = settings.training
    arguments = train_arguments(training_set_rev, f"{CHECKPOINT_MOUNT}/{training_set_rev}")
    execution_timeout = timedelta(minutes=training.execution_timeout_minutes)
    manifest = contract.training_pod_manifest(
        "fraud-train",
        training.image,
        arguments,
        resources=contract.TrainingResources(gpus=training.gpus),
        env=pod_environment(settings),
        # The pod's own deadline is Airflow's timeout, so a pod Airflow lost track of stops no later.
        active_deadline_seconds=int(execution_timeout.total_seconds()),
    )
    _gpu_placement(settings, manifest)
    return _pod_operator(
        settings, TRAIN_TASK_ID, manifest, execution_timeout=execution_timeout, **operator_args
    )


def step_pod_operator(
    settings: Settings, step: str, arguments: list[str], task_id: str | None = None, **operator_args: Any
):
    """A step after training (`python -m training <step> ...`) as a CPU pod of the training image: the Airflow
    image carries neither torch nor MLflow. Its result comes back like train's (the pod results table). The
    task id is the step's name unless given."""
    manifest = contract.training_pod_manifest(
        f"fraud-{step}",
        settings.training.image,
        [step, *arguments],
        step=True,
        env=pod_environment(settings),
    )
    if step in contract.LEDGER_STEPS:
        contract.as_promoter(manifest)
    timeout = timedelta(seconds=manifest["spec"]["activeDeadlineSeconds"])
    return _pod_operator(settings, task_id or step, manifest, execution_timeout=timeout, **operator_args)


def trial_pod_operator(settings: Settings, study: str, slots: Sequence[int]):
    """The tuning DAG's trials in the cluster profile: one GPU pod of the training image per slot (a mapped
    task, `tuning.parallelism` at a time), each `python -m training trial`, its checkpoints on the claim."""
    training = settings.training
    execution_timeout = timedelta(minutes=training.execution_timeout_minutes)

    def arguments(slot: int) -> list[str]:
        return ["trial", "--study", study, "--slot", str(slot), "--checkpoint-dir",
                f"{CHECKPOINT_MOUNT}/tuning"]  # fmt: skip

    manifest = contract.training_pod_manifest(
        "fraud-trial",
        training.image,
        arguments(0),
        resources=contract.TrainingResources(gpus=1),  # one GPU a trial: trials are the parallelism
        env=pod_environment(settings),
        active_deadline_seconds=int(execution_timeout.total_seconds()),
    )
    _gpu_placement(settings, manifest)
    kwargs = _pod_operator_kwargs(settings, "trial", manifest)
    kwargs.pop("arguments")
    operator: Any = _training_pod_operator_class()  # a BaseOperator subclass, built on first use
    return operator.partial(
        **kwargs,
        execution_timeout=execution_timeout,
        max_active_tis_per_dagrun=settings.tuning.parallelism,
    ).expand(arguments=[arguments(slot) for slot in slots])


def _gpu_placement(settings: Settings, manifest: dict[str, Any]) -> None:
    """The GPU pool's node selector and tolerations, and the checkpoint claim mounted at CHECKPOINT_MOUNT."""
    training = settings.training
    spec = manifest["spec"]
    spec["nodeSelector"] = dict(training.node_selector)
    spec["tolerations"] = [dict(t) for t in training.tolerations]
    spec["volumes"].append(
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": training.checkpoint_claim}}
    )
    spec["containers"][0]["volumeMounts"].append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT})


def _pod_operator(settings: Settings, task_id: str, manifest: dict[str, Any], **operator_args: Any):
    """The pod task; `operator_args` over the manifest's (e.g. a templated `image`: a version's own)."""
    return _training_pod_operator_class()(
        **{**_pod_operator_kwargs(settings, task_id, manifest), **operator_args}
    )


def _pod_operator_kwargs(settings: Settings, task_id: str, manifest: dict[str, Any]) -> dict[str, Any]:
    from kubernetes.client import models as k8s

    trainer = manifest["spec"]["containers"][0]
    return dict(
        task_id=task_id,
        namespace=settings.cluster.kubernetes_namespace,
        # In the cluster, with the pod's service account: passed on to the deferred wait's trigger, whose
        # hook would otherwise look for a kubeconfig the triggerer does not have (apache/airflow#44325).
        in_cluster=None if settings.cluster.kubernetes_conn_id else True,
        kubernetes_conn_id=settings.cluster.kubernetes_conn_id or "kubernetes_default",
        image=trainer["image"],
        cmds=list(trainer["command"]),
        arguments=list(trainer["args"]),
        pod_template_dict=manifest,
        base_container_name=contract.TRAINING_CONTAINER,
        name=manifest["metadata"]["name"],
        random_name_suffix=True,
        # No XCom sidecar: the result comes back through the pod results table (TrainingPodOperator).
        do_xcom_push=False,
        on_finish_action="delete_pod",
        durable=True,  # a retry reattaches to the running pod (Airflow 3.3's name for reattach_on_restart)
        deferrable=True,
        startup_timeout_seconds=settings.training.startup_timeout_seconds,
        get_logs=True,
        # The operator's own fields win over the template's, and its default here is "File".
        termination_message_policy=trainer["terminationMessagePolicy"],
        # The promoter's login for the pods that write the promotion history, the trainer's for the rest.
        env_from=[
            k8s.V1EnvFromSource(secret_ref=k8s.V1SecretEnvSource(name=credentials_secret(settings, manifest)))
        ],
    )


def credentials_secret(settings: Settings, manifest: dict[str, Any]) -> str:
    """The Secret whose keys become the pod's environment: the promoter's for a pod run as the promoter."""
    training = settings.training
    return (
        training.promotion_credentials_secret
        if contract.is_promoter(manifest)
        else training.credentials_secret
    )


def container_image_id(pod: Any, container: str) -> str | None:
    """The image id the node reported for `container` of `pod` (its status), e.g. `repo@sha256:...`."""
    statuses = getattr(getattr(pod, "status", None), "container_statuses", None) or []
    for status in statuses:
        if status.name == container and status.image_id:
            return str(status.image_id)
    return None


@functools.cache
def _training_pod_operator_class() -> type:
    """KubernetesPodOperator whose result is what its pod recorded in the pod results table
    (core/pod_results.py), read once the pod has succeeded, in both the worker's wait and the deferred
    one's return, and pushed as the task's XCom: no sidecar and no exec (why: core/pod_results.py). Built on
    first use: the provider is a seconds-long import that the local profile's DAG parse should not pay."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    class TrainingPodOperator(KubernetesPodOperator):
        _result_of: tuple[tuple[str, str], Any] | None = None

        def execute(self, context):
            super().execute(context)  # deferrable: raises TaskDeferred, unless the pod is already done
            return self.pod_result(context)

        def trigger_reentry(self, context, event):
            super().trigger_reentry(context, event)  # raises when the pod failed (or re-defers)
            return self.pod_result(context)

        def pod_result(self, context) -> Any:
            """The result the pod this task followed recorded, pushed as the task's return value (the runner
            pushes none: do_xcom_push is off, so the provider adds no sidecar); its row is then deleted."""
            from core import pod_results
            from core.settings import get_settings

            pod = self.pod
            if pod is None or pod.metadata is None:
                raise pod_results.PodResultMissingError(f"{self.task_id}: no pod was followed to a result")
            key = (str(pod.metadata.namespace or self.namespace), str(pod.metadata.name))
            if self._result_of is not None and self._result_of[0] == key:
                return self._result_of[1]  # the pod was already done when the task deferred: read once
            from core import lineage

            settings = get_settings()
            url = settings.promotion_ledger_url
            result = pod_results.read(url, *key)
            if isinstance(result, dict) and lineage.RELAY_KEY in result:
                # the pod's OpenLineage events: its volume is read-only, this worker's is not
                events = result[lineage.RELAY_KEY]
                result = {k: v for k, v in result.items() if k != lineage.RELAY_KEY}
                lineage.relay(settings, events)
            # What ran, as the node reported it: the image by digest (the tag can be pushed again).
            image_id = container_image_id(
                pod if pod.status else getattr(self, "remote_pod", None), self.base_container_name
            )
            if image_id and isinstance(result, dict):
                result = {**result, "image_id": image_id}
            context["ti"].xcom_push(key="return_value", value=result)
            self._result_of = (key, result)
            pod_results.forget(url, *key)
            return result

    TrainingPodOperator.__qualname__ = "TrainingPodOperator"  # importable by that name: see __getattr__
    return TrainingPodOperator


def __getattr__(name: str) -> Any:
    # `orchestration.training_task.TrainingPodOperator` resolves without importing the provider first.
    if name == "TrainingPodOperator":
        return _training_pod_operator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run_training_process(
    arguments: list[str],
    timeout_s: float | None = None,
    *,
    program: Sequence[str] = ("-m", "training"),
    grace_s: float = TERMINATE_GRACE_S,
) -> dict:
    """The local profile's train task: the same CLI as a child process; its last stdout line is the result.

    The child leads a process group of its own, which its DataLoader workers and anything else it starts
    join. It ends with the task: when `timeout_s` passes, when the task process gets SIGTERM (how Airflow
    stops a task that is marked failed or cleared, or whose heartbeat is lost), or when anything else
    interrupts the wait (Airflow's execution_timeout raises in the task), the whole group gets SIGTERM,
    then SIGKILL after `grace_s`, and TrainingProcessError names the command and the reason (the task's
    own exception, for the last). `program`: what the interpreter runs instead of `-m training` (tests)."""
    import subprocess
    import sys
    import threading

    shown = (
        "`python " + " ".join(p if len(p) <= 120 else f"{p[:100]}..." for p in [*program, *arguments]) + "`"
    )
    stopping = False

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:  # a second SIGTERM while the group is being stopped: let that finish
            return
        stopping = True
        if callable(previous):  # Airflow's handler: it calls the operator's on_kill
            previous(signum, frame)
        raise TrainingProcessError(
            f"{shown} was stopped: the task process got {signal.Signals(signum).name}; the training "
            "process group was terminated"
        )

    # Handlers can only be set on the main thread (where Airflow runs a task); elsewhere the timeout and
    # exceptions still stop the child. Set before the child starts, so no SIGTERM can orphan it.
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM)
    if on_main_thread:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        process = subprocess.Popen(
            [sys.executable, *program, *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own session and process group, so the group can be stopped whole
        )
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stopping = True
            _terminate_group(process, grace_s)
            raise TrainingProcessError(
                f"{shown} ran past its timeout of {timeout_s:g} s (the local profile's "
                f"MLOPS_TRAINING__LOCAL_TIMEOUT_MINUTES); its process group was terminated. Last output:\n"
                f"{_tail(process, grace_s)}"
            ) from None
        except BaseException:
            stopping = True
            _terminate_group(process, grace_s)
            raise
    finally:
        if on_main_thread:  # None: a handler not set from Python, which cannot be put back
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    if process.returncode == EXIT_PIPELINE_ERROR:
        raise TrainingRefusedError(f"{shown} stopped: {_failure_message(stdout, stderr)}")
    if process.returncode:
        raise TrainingProcessError(f"{shown} exited {process.returncode}:\n{stderr[-4000:]}")
    lines = stdout.strip().splitlines()
    if not lines:
        raise TrainingProcessError(f"{shown} printed no result")
    return json.loads(lines[-1])


def _failure_message(stdout: str, stderr: str) -> str:
    """The failure the training CLI reports on its last stdout line (training/cli.py main), else stderr."""
    lines = stdout.strip().splitlines()
    try:
        failure = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        failure = {}
    if isinstance(failure, dict) and failure.get("message"):
        return f"{failure.get('error', 'error')}: {failure['message']}"
    return stderr[-4000:] or "(no message)"


def local_task_timeout(settings: Settings) -> timedelta:
    """The local train task's Airflow execution_timeout: the child's own timeout, its grace to stop, and a
    minute to spare, so the child's timeout (with its clear error) comes first and Airflow's is a backstop."""
    return timedelta(minutes=settings.training.local_timeout_minutes, seconds=TERMINATE_GRACE_S + 60)


def _terminate_group(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the child's process group; SIGKILL to whatever of it is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)  # the child leads its group: the group id is its pid
        except ProcessLookupError:
            break
        deadline = time.monotonic() + grace_s
        while _group_alive(process) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _group_alive(process):
            break
    process.wait()


def _group_alive(process: subprocess.Popen) -> bool:
    process.poll()  # reaps the child once it exits, so it no longer counts as a member
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def _tail(process: subprocess.Popen, grace_s: float) -> str:
    """The end of what the stopped child wrote to stderr (its log)."""
    import subprocess

    try:
        _, stderr = process.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        return "(unavailable: a process that left the group still holds the output pipe)"
    return stderr[-4000:]
