"""What the Kubernetes manifests in infra/ and the retrain DAG must agree on, and the training pod itself.

The retrain DAG launches training with KubernetesPodOperator; infra/k8s creates the namespace, ServiceAccount,
PriorityClass, ResourceQuota, LimitRange and NetworkPolicies that pod runs under. A rename on one side only
would surface as a pod that is refused admission or cannot reach MLflow, so both sides take the names from
here and the tests check the rendered manifests against them. The pod spec builder and the two checks below
(Pod Security "restricted", quota fit) are pure functions over plain dicts in the Kubernetes API's own JSON
shape, so the same dict can be validated against the OpenAPI schema and handed to the operator.

Importing this module has no side effects.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from core.pod_results import POD_NAME_ENV

# The oldest Kubernetes minor the manifests target: the namespaces pin their Pod Security version to it and
# the tests validate every object against its OpenAPI schema.
KUBERNETES_VERSION = "1.33"

# Namespaces. The training namespace is also `ClusterServices.kubernetes_namespace` in core/settings.py.
ORCHESTRATION_NAMESPACE = "mlops-orchestration"
TRAINING_NAMESPACE = "mlops-training"
SERVING_NAMESPACE = "mlops-serving"

# Identities. Training pods run as TRAINING_SERVICE_ACCOUNT, which has no API permissions at all; the Airflow
# worker's ServiceAccount (named in infra/helm) is bound in the training namespace to TRAINING_LAUNCHER_ROLE,
# just enough to create, watch, read the logs of and delete the pods it launches. The triggerer, which follows
# a deferred pod task's pod (KubernetesPodTrigger), is bound to TRAINING_WATCHER_ROLE: read the pod, its logs
# and events, delete it when the task is killed; it creates nothing.
TRAINING_SERVICE_ACCOUNT = "mlops-trainer"
# Separated duties: the step pods that write the promotion history and so move the champion (the gate's
# decision, a person's approval, the monitor's rollback) run as PROMOTER_SERVICE_ACCOUNT with the promoter's
# Secret (`training.promotion_credentials_secret`); every other pod, the ones running training code, with a
# database login that cannot write that history (infra/README.md, "Separated duties"). Granted nothing in
# the Kubernetes API either.
PROMOTER_SERVICE_ACCOUNT = "mlops-promoter"
LEDGER_STEPS = frozenset({"promote", "approve", "retention-models"})  # they read or write the history
AIRFLOW_WORKER_SERVICE_ACCOUNT = "airflow-worker"
AIRFLOW_TRIGGERER_SERVICE_ACCOUNT = "airflow-triggerer"
TRAINING_LAUNCHER_ROLE = "training-pod-launcher"
TRAINING_WATCHER_ROLE = "training-pod-watcher"

# Serving outranks training, so a training pod can never preempt the online feature server.
TRAINING_PRIORITY_CLASS = "mlops-training"
SERVING_PRIORITY_CLASS = "mlops-serving"

# GPUs. The resource is the NVIDIA device plugin's; the node label is set by NVIDIA GPU feature discovery
# (or by hand on the GPU pool, see infra/README.md); the taint keeps other pods off the GPU nodes.
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
GPU_TAINT_KEY = "nvidia.com/gpu"

# Images, by repository name; the registry and the tag are deployment choices.
TRAINING_IMAGE_REPOSITORY = "mlops-fraud-training"
AIRFLOW_IMAGE_REPOSITORY = "mlops-fraud-airflow"

# The training container: the typed training CLI is its command, and the image's non-root user runs it.
TRAINING_CONTAINER = "trainer"
# What a training-image pod learns of itself through the downward API: its name, the key of its result (the
# namespace is its settings', which are its launcher's).
POD_IDENTITY_ENV = {POD_NAME_ENV: "metadata.name"}
TRAINING_COMMAND = ("python", "-m", "training")
TRAINING_UID = 10001
APP_LABEL = "app.kubernetes.io/name"
TRAINING_APP = "mlops-trainer"

# Shared storage (infra/README.md, "Storage"): one ReadWriteMany filesystem (NFS, EFS, CephFS, Filestore)
# holds $MLOPS_HOME: landing, lake, DVC repository with its cache and remote, Feast registry, MLflow's
# artifacts. Every namespace that mounts it has a claim of this name, bound to a PersistentVolume of its own
# for the same export (a claim belongs to one namespace and a volume binds one claim).
DATA_CLAIM = "mlops-data"
DATA_VOLUMES = {
    ORCHESTRATION_NAMESPACE: "mlops-data-orchestration",  # read-write: Airflow's task pods and MLflow
    TRAINING_NAMESPACE: "mlops-data-training",  # read-only: training and step pods
    SERVING_NAMESPACE: "mlops-data-serving",  # read-only: the feature server reads the Feast registry
}
# Where every pod mounts it; MLOPS_HOME in every pod, so each path under it is the same in every pod.
DATA_MOUNT = "/mlops"
# MLflow's proxied artifact store (`mlflow server --serve-artifacts`): a folder of the shared filesystem that
# only the MLflow server mounts read-write; pods upload over HTTP with no storage credentials.
MLFLOW_ARTIFACTS_SUBPATH = "mlflow-artifacts"
# The Feast registry the features DAG writes ($MLOPS_HOME/feast/registry.db) and the feature server reads.
FEAST_REGISTRY_PATH = f"{DATA_MOUNT}/feast/registry.db"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class TrainingResources:
    """What one training pod asks for. Memory request equals its limit: a trainer that is OOM-killed midway
    wastes the GPU hours spent so far, so it gets its memory guaranteed rather than overcommitted."""

    cpu_request: str = "4"
    cpu_limit: str = "8"
    memory: str = "24Gi"
    gpus: int = 1
    ephemeral_storage: str = "20Gi"
    # /dev/shm for torch DataLoader workers; memory-backed, so it counts against the memory limit.
    shared_memory: str = "4Gi"
    # /tmp for checkpoints and library caches; disk-backed, counted against ephemeral storage.
    scratch: str = "16Gi"


# The steps after training (evaluate, register, promote, export) run in the training image too (they import
# torch and MLflow, which the Airflow image does not carry), on CPU nodes: a holdout and one model fit here.
STEP_RESOURCES = TrainingResources(
    cpu_request="1", cpu_limit="2", memory="6Gi", gpus=0, ephemeral_storage="6Gi", shared_memory="1Gi",
    scratch="4Gi",
)  # fmt: skip


def training_image(registry: str, tag: str) -> str:
    """The training image reference; a moving tag would make two runs of one interval train different code."""
    if not tag or tag == "latest":
        raise ValueError(f"training image tag {tag!r}: pin a version or a digest, never 'latest' or empty")
    return f"{registry.rstrip('/')}/{TRAINING_IMAGE_REPOSITORY}:{tag}"


def training_command(gpus: int) -> list[str]:
    """The container command: the training CLI, under torchrun with one process per GPU when the pod has
    more than one (only rank 0 opens the MLflow run and writes the XCom: training/steps.py and cli.py)."""
    if gpus > 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={gpus}", "--module", TRAINING_COMMAND[-1]]
    return list(TRAINING_COMMAND)


def training_pod_spec(
    image: str,
    args: Sequence[str],
    *,
    resources: TrainingResources = TrainingResources(),
    env: Mapping[str, str] | None = None,
    active_deadline_seconds: int = 6 * 3600,
) -> dict[str, Any]:
    """The PodSpec of one training run: `python -m training *args` on a GPU node, restricted-profile safe,
    the shared volume mounted read-only at DATA_MOUNT (MLOPS_HOME)."""
    if resources.gpus < 1:
        raise ValueError(f"a training pod needs at least one {GPU_RESOURCE}, got {resources.gpus}")
    return _pod_spec(image, args, resources, env, active_deadline_seconds)


def step_pod_spec(
    image: str,
    args: Sequence[str],
    *,
    resources: TrainingResources = STEP_RESOURCES,
    env: Mapping[str, str] | None = None,
    active_deadline_seconds: int = 3600,
) -> dict[str, Any]:
    """The PodSpec of a step after training (`python -m training evaluate|register|promote|export`): the
    training pod's image, identity and hardening, on any node, without GPUs."""
    if resources.gpus:
        raise ValueError(f"a step pod runs without GPUs; got {resources.gpus} {GPU_RESOURCE}")
    return _pod_spec(image, args, resources, env, active_deadline_seconds)


def _pod_spec(
    image: str,
    args: Sequence[str],
    resources: TrainingResources,
    env: Mapping[str, str] | None,
    active_deadline_seconds: int,
) -> dict[str, Any]:
    # The root filesystem is read-only, so every library cache (torch, matplotlib, pip) goes under /tmp.
    container_env = {"MLOPS_PROFILE": "cluster", "HOME": "/tmp", **(env or {}), "MLOPS_HOME": DATA_MOUNT}
    amounts: dict[str, str] = {"memory": resources.memory, "ephemeral-storage": resources.ephemeral_storage}
    if resources.gpus:
        amounts[GPU_RESOURCE] = str(resources.gpus)
    spec: dict[str, Any] = {
        "serviceAccountName": TRAINING_SERVICE_ACCOUNT,
        # Training never talks to the Kubernetes API, so it gets no token to leak.
        "automountServiceAccountToken": False,
        "priorityClassName": TRAINING_PRIORITY_CLASS,
        "restartPolicy": "Never",
        # A hung epoch must not hold a GPU forever; Airflow's own timeout cannot reach a pod it lost track of.
        "activeDeadlineSeconds": active_deadline_seconds,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": TRAINING_UID,
            "runAsGroup": TRAINING_UID,
            "fsGroup": TRAINING_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": TRAINING_CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": training_command(resources.gpus),
                "args": list(args),
                "env": [
                    *({"name": name, "value": value} for name, value in container_env.items()),
                    # The pod's own name: the key its result is recorded under for the task that launched
                    # it (core/pod_results.py).
                    *(
                        {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field}}}
                        for name, field in POD_IDENTITY_ENV.items()
                    ),
                ],
                "resources": {
                    "requests": {"cpu": resources.cpu_request, **amounts},
                    "limits": {"cpu": resources.cpu_limit, **amounts},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "scratch", "mountPath": "/tmp"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                    # Training sets by revision, the gold validation records: read, never written here.
                    {"name": "data", "mountPath": DATA_MOUNT, "readOnly": True},
                ],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [
            {"name": "scratch", "emptyDir": {"sizeLimit": resources.scratch}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": resources.shared_memory}},
            {"name": "data", "persistentVolumeClaim": {"claimName": DATA_CLAIM, "readOnly": True}},
        ],
    }
    if resources.gpus:
        spec["nodeSelector"] = {GPU_NODE_LABEL: "true"}
        spec["tolerations"] = [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]
    return spec


def training_pod_manifest(name: str, image: str, args: Sequence[str], **spec_options: Any) -> dict[str, Any]:
    """A whole Pod in the training namespace (what KubernetesPodOperator takes as `pod_template_dict`); a
    step pod where `step=True`."""
    if len(name) > 63 or not _DNS_LABEL.match(name):
        raise ValueError(
            f"pod name {name!r} is not a DNS label (lowercase alphanumerics and '-', at most 63)"
        )
    build = step_pod_spec if spec_options.pop("step", False) else training_pod_spec
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": TRAINING_NAMESPACE, "labels": {APP_LABEL: TRAINING_APP}},
        "spec": build(image, args, **spec_options),
    }


# --- Pod Security Standards, "restricted" profile --------------------------------------------------------
# The namespaces are labelled `pod-security.kubernetes.io/enforce: restricted`, so the API server refuses a
# pod that breaks any rule below. Checking the same rules here catches it in a test instead of at 3 a.m.
# Source: https://kubernetes.io/docs/concepts/security/pod-security-standards/ (baseline + restricted).

_RESTRICTED_VOLUME_TYPES = frozenset(
    {
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    }
)
_SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
_SECCOMP_ALLOWED = frozenset({"RuntimeDefault", "Localhost"})
_SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
_POD_TEMPLATE_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"})


def workload_pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The PodSpec inside a Pod or a workload object; None for kinds that run no pods."""
    kind = obj.get("kind")
    if kind == "Pod":
        return obj.get("spec", {})
    if kind in _POD_TEMPLATE_KINDS:
        return obj.get("spec", {}).get("template", {}).get("spec", {})
    if kind == "CronJob":
        return obj.get("spec", {}).get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec", {})
    return None


def _all_containers(pod_spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [
        (field, container)
        for field in ("initContainers", "containers", "ephemeralContainers")
        for container in pod_spec.get(field) or []
    ]


def restricted_profile_violations(pod_spec: Mapping[str, Any]) -> list[str]:
    """Every rule of the restricted Pod Security profile that this PodSpec breaks; empty when admitted."""
    problems: list[str] = []
    pod_sc = pod_spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod_spec.get(field):
            problems.append(f"pod: {field} must be false")
    for volume in pod_spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUME_TYPES:
            problems.append(f"volume {volume.get('name')}: type {sorted(kinds)} not allowed (hostPath etc.)")
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            problems.append(f"pod: sysctl {sysctl.get('name')} is not in the safe set")
    problems += _security_context_violations("pod", pod_sc)
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod: runAsUser must not be 0")

    for field, container in _all_containers(pod_spec):
        where = f"{field} {container.get('name')}"
        sc = container.get("securityContext") or {}
        problems += _security_context_violations(where, sc)
        if sc.get("privileged"):
            problems.append(f"{where}: privileged must be false")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation must be set to false")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{where}: procMount must be Default")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}: capabilities.drop must include ALL")
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: capabilities.add may only contain NET_BIND_SERVICE")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where}: hostPort {port['hostPort']} not allowed")
        # Non-root and seccomp may be set once on the pod or on every container; a container may not undo it.
        if sc.get("runAsNonRoot") is False or (not sc.get("runAsNonRoot") and not pod_sc.get("runAsNonRoot")):
            problems.append(f"{where}: runAsNonRoot must be true (on the container or the pod)")
        if sc.get("runAsUser") == 0:
            problems.append(f"{where}: runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in _SECCOMP_ALLOWED:
            problems.append(
                f"{where}: seccompProfile.type must be RuntimeDefault or Localhost, got {seccomp}"
            )
    return problems


def _security_context_violations(where: str, sc: Mapping[str, Any]) -> list[str]:
    problems = []
    if (sc.get("windowsOptions") or {}).get("hostProcess"):
        problems.append(f"{where}: windowsOptions.hostProcess must be false")
    selinux = sc.get("seLinuxOptions") or {}
    if selinux.get("type", "") not in _SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
        problems.append(f"{where}: seLinuxOptions {selinux} not allowed")
    seccomp = (sc.get("seccompProfile") or {}).get("type")
    if seccomp == "Unconfined":
        problems.append(f"{where}: seccompProfile Unconfined not allowed")
    apparmor = (sc.get("appArmorProfile") or {}).get("type")
    if apparmor not in (None, "RuntimeDefault", "Localhost"):
        problems.append(f"{where}: appArmorProfile {apparmor} not allowed")
    return problems


# --- Quota fit ---------------------------------------------------------------------------------------------


def parse_quantity(quantity: str | int | float) -> Decimal:
    """A Kubernetes resource quantity ("500m", "24Gi", "1e3", 2) as an exact number, by the Kubernetes
    client's own parser."""
    from kubernetes.utils import parse_quantity as parse

    try:
        return parse(quantity)
    except ValueError as exc:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (e.g. 500m, 2, 24Gi, 1e3)") from exc


def _container_amounts(container: Mapping[str, Any], kind: str) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    amounts = {name: parse_quantity(value) for name, value in (resources.get(kind) or {}).items()}
    if kind == "requests":
        # The API server defaults a missing request to the limit.
        for name, value in (resources.get("limits") or {}).items():
            amounts.setdefault(name, parse_quantity(value))
    return amounts


def pod_resource_totals(pod_spec: Mapping[str, Any], kind: str) -> dict[str, Decimal]:
    """What the scheduler and the quota charge the pod: the larger of the sum over its containers (plus
    restartable sidecars) and the largest single init container, per resource."""
    sums: dict[str, Decimal] = {}
    peak_init: dict[str, Decimal] = {}
    for container in pod_spec.get("containers") or []:
        for name, value in _container_amounts(container, kind).items():
            sums[name] = sums.get(name, Decimal(0)) + value
    for container in pod_spec.get("initContainers") or []:
        amounts = _container_amounts(container, kind)
        if container.get("restartPolicy") == "Always":
            for name, value in amounts.items():
                sums[name] = sums.get(name, Decimal(0)) + value
        else:
            for name, value in amounts.items():
                peak_init[name] = max(peak_init.get(name, Decimal(0)), value)
    return {
        name: max(sums.get(name, Decimal(0)), peak_init.get(name, Decimal(0))) for name in sums | peak_init
    }


def _quota_usage(key: str, requests: Mapping[str, Decimal], limits: Mapping[str, Decimal]) -> Decimal | None:
    if key == "pods":
        return Decimal(1)
    if key.startswith("requests."):
        return requests.get(key.removeprefix("requests."), Decimal(0))
    if key.startswith("limits."):
        return limits.get(key.removeprefix("limits."), Decimal(0))
    if key in ("cpu", "memory", "ephemeral-storage"):
        return requests.get(key, Decimal(0))
    return None  # object counts (configmaps, services, ...) do not depend on the pod spec


def _fmt(value: Decimal) -> str:
    return str(int(value)) if value == value.to_integral_value() else f"{float(value):g}"


def quota_fit_violations(
    pod_spec: Mapping[str, Any],
    quota_hard: Mapping[str, str],
    limit_range_items: Sequence[Mapping[str, Any]] = (),
) -> list[str]:
    """Why this pod would be refused in an otherwise empty namespace with this ResourceQuota `spec.hard` and
    these LimitRange `spec.limits` items; empty when it fits. LimitRange defaults are applied first, as the
    admission controller does, so a container without a CPU limit is judged with the namespace's default."""
    defaults: dict[str, dict[str, str]] = {"requests": {}, "limits": {}}
    for item in limit_range_items:
        if item.get("type") == "Container":
            defaults["limits"].update(item.get("default") or {})
            defaults["requests"].update(item.get("defaultRequest") or {})
    spec = _with_defaults(pod_spec, defaults)
    problems: list[str] = []

    requests = pod_resource_totals(spec, "requests")
    limits = pod_resource_totals(spec, "limits")
    for key, hard in quota_hard.items():
        used = _quota_usage(key, requests, limits)
        if used is not None and used > parse_quantity(hard):
            problems.append(f"ResourceQuota {key}: the pod needs {_fmt(used)}, the quota allows {hard}")
        # A quota on limits.X or requests.X makes the API server refuse any container that leaves X unset.
        for kind in ("requests", "limits"):
            resource = key.removeprefix(f"{kind}.")
            if key.startswith(f"{kind}.") and resource in ("cpu", "memory", "ephemeral-storage"):
                for _, container in _all_containers(spec):
                    if resource not in _container_amounts(container, kind):
                        problems.append(
                            f"container {container.get('name')}: {kind}.{resource} unset under {key}"
                        )

    for item in limit_range_items:
        if item.get("type") == "Container":
            for _, container in _all_containers(spec):
                problems += _limit_range_container(container, item)
        elif item.get("type") == "Pod":
            for name, bound in (item.get("max") or {}).items():
                if limits.get(name, Decimal(0)) > parse_quantity(bound):
                    problems.append(f"LimitRange Pod max {name}: the pod's limits total {_fmt(limits[name])}")
    return problems


def _with_defaults(pod_spec: Mapping[str, Any], defaults: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    spec = dict(pod_spec)
    for field in ("initContainers", "containers"):
        filled = []
        for container in pod_spec.get(field) or []:
            resources = container.get("resources") or {}
            limits = {**defaults["limits"], **(resources.get("limits") or {})}
            # A container given only a limit gets its request from the limit, not from defaultRequest.
            requests = {
                **{k: v for k, v in defaults["requests"].items() if k not in (resources.get("limits") or {})},
                **(resources.get("requests") or {}),
            }
            filled.append({**container, "resources": {"requests": requests, "limits": limits}})
        spec[field] = filled
    return spec


def _limit_range_container(container: Mapping[str, Any], item: Mapping[str, Any]) -> list[str]:
    name = container.get("name")
    requests = _container_amounts(container, "requests")
    limits = _container_amounts(container, "limits")
    problems = []
    for resource, bound in (item.get("max") or {}).items():
        for kind, amounts in (("requests", requests), ("limits", limits)):
            if amounts.get(resource, Decimal(0)) > parse_quantity(bound):
                problems.append(
                    f"container {name}: {kind}.{resource}={_fmt(amounts[resource])}"
                    f" exceeds LimitRange max {bound}"
                )
    for resource, bound in (item.get("min") or {}).items():
        if requests.get(resource, Decimal(0)) < parse_quantity(bound):
            problems.append(f"container {name}: requests.{resource} is below LimitRange min {bound}")
    for resource, ratio in (item.get("maxLimitRequestRatio") or {}).items():
        if requests.get(resource) and limits.get(resource, Decimal(0)) / requests[resource] > parse_quantity(
            ratio
        ):
            problems.append(f"container {name}: {resource} limit/request exceeds LimitRange ratio {ratio}")
    return problems


def as_promoter(manifest: dict[str, Any]) -> dict[str, Any]:
    """`manifest` (a step pod) run with the promoter's identity: the one pod kind that may write the promotion
    history. The operator gives it the promoter's Secret (orchestration/training_task.py)."""
    manifest["spec"]["serviceAccountName"] = PROMOTER_SERVICE_ACCOUNT
    return manifest


def writable_folder(manifest: dict[str, Any], folder: str) -> dict[str, Any]:
    """`manifest` (a training-image pod) with `folder` of the shared volume (relative to it: `lake/decisions`)
    mounted read-write over its read-only mount, and nothing else of the volume writable: the same claim,
    a second volume of it, a subPath mount."""
    parts = PurePosixPath(folder).parts
    if not parts or PurePosixPath(folder).is_absolute() or ".." in parts:
        raise ValueError(f"a writable folder is a path inside the shared volume, got {folder!r}")
    spec = manifest["spec"]
    name = "data-" + "-".join(parts).replace("_", "-")[:40]
    if not any(volume["name"] == name for volume in spec["volumes"]):
        spec["volumes"].append({"name": name, "persistentVolumeClaim": {"claimName": DATA_CLAIM}})
    spec["containers"][0]["volumeMounts"].append(
        {"name": name, "mountPath": f"{DATA_MOUNT}/{folder}", "subPath": folder}
    )
    return manifest


def is_promoter(manifest: dict[str, Any]) -> bool:
    return manifest["spec"].get("serviceAccountName") == PROMOTER_SERVICE_ACCOUNT
