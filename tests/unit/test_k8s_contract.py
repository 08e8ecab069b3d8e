"""The training pod contract: names, the pod spec, the restricted-profile check and the quota fit check.

The checks are tested here on small inline pods and quotas, each negative case a single mutation of a pod that
passes, so a check that stopped looking at a field would fail its case. The rendered manifests and the real
KubernetesPodOperator are exercised in tests/integration/test_infra_k8s.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from fractions import Fraction

import pytest

from core.settings import ClusterServices
from orchestration import k8s_contract as contract

IMAGE = "registry.example.com/mlops-fraud-training:0.1.0"


def _pod(**spec_options) -> dict:
    return contract.training_pod_spec(IMAGE, ["--interval-start", "2026-01-01"], **spec_options)


def test_training_namespace_is_the_settings_default():
    assert ClusterServices().kubernetes_namespace == contract.TRAINING_NAMESPACE


def test_training_pod_runs_the_training_cli_under_the_contract_names():
    spec = _pod()
    (container,) = spec["containers"]
    assert container["command"] == ["python", "-m", "training"]
    assert container["args"] == ["--interval-start", "2026-01-01"]
    assert container["image"] == IMAGE
    assert spec["serviceAccountName"] == contract.TRAINING_SERVICE_ACCOUNT
    assert spec["priorityClassName"] == contract.TRAINING_PRIORITY_CLASS
    assert spec["automountServiceAccountToken"] is False
    assert container["resources"]["requests"][contract.GPU_RESOURCE] == "1"
    assert container["resources"]["limits"][contract.GPU_RESOURCE] == "1"
    assert spec["nodeSelector"] == {contract.GPU_NODE_LABEL: "true"}
    assert {"key": contract.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["securityContext"]["runAsUser"] == contract.TRAINING_UID


def test_training_pod_takes_resources_and_environment_from_the_caller():
    spec = _pod(resources=contract.TrainingResources(gpus=2, memory="48Gi"), env={"MLFLOW_RUN_NAME": "r1"})
    (container,) = spec["containers"]
    assert container["resources"]["limits"] == {
        "cpu": "8",
        "memory": "48Gi",
        "ephemeral-storage": "20Gi",
        contract.GPU_RESOURCE: "2",
    }
    assert {"name": "MLFLOW_RUN_NAME", "value": "r1"} in container["env"]
    assert {"name": "MLOPS_PROFILE", "value": "cluster"} in container["env"]


def test_a_training_pod_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match=r"at least one nvidia\.com/gpu"):
        _pod(resources=contract.TrainingResources(gpus=0))


def test_a_step_pod_is_the_training_pod_without_gpus_or_gpu_nodes():
    step = contract.step_pod_spec(IMAGE, ["evaluate", "--run-id", "r1"])
    train = _pod()
    (container,) = step["containers"]
    assert container["command"] == ["python", "-m", "training"]
    for kind in ("requests", "limits"):
        assert contract.GPU_RESOURCE not in container["resources"][kind]
    assert "nodeSelector" not in step and "tolerations" not in step
    for field in (
        "serviceAccountName",
        "securityContext",
        "priorityClassName",
        "automountServiceAccountToken",
    ):
        assert step[field] == train[field]
    assert contract.restricted_profile_violations(step) == []
    with pytest.raises(ValueError, match="without GPUs"):
        contract.step_pod_spec(IMAGE, [], resources=contract.TrainingResources(gpus=1))
    manifest = contract.training_pod_manifest("fraud-evaluate", IMAGE, ["evaluate"], step=True)
    assert manifest["metadata"]["labels"] == {contract.APP_LABEL: contract.TRAINING_APP}  # same egress policy
    assert contract.GPU_RESOURCE not in manifest["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize("spec", [_pod, lambda: contract.step_pod_spec(IMAGE, ["export"])])
def test_every_pod_of_the_training_image_reads_the_shared_volume_read_only_as_mlops_home(spec):
    pod = spec()
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == contract.DATA_MOUNT]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"] == {"claimName": contract.DATA_CLAIM, "readOnly": True}
    assert {"name": "MLOPS_HOME", "value": contract.DATA_MOUNT} in container["env"]


def test_mlops_home_is_the_mount_whatever_the_caller_passes():
    (container,) = _pod(env={"MLOPS_HOME": "/somewhere/else"})["containers"]
    assert [e["value"] for e in container["env"] if e["name"] == "MLOPS_HOME"] == [contract.DATA_MOUNT]


@pytest.mark.parametrize(
    ("gpus", "command"),
    [
        (1, ["python", "-m", "training"]),
        (2, ["torchrun", "--standalone", "--nproc-per-node=2", "--module", "training"]),
        (8, ["torchrun", "--standalone", "--nproc-per-node=8", "--module", "training"]),
    ],
)
def test_more_than_one_gpu_runs_one_process_per_gpu_under_torchrun(gpus, command):
    assert contract.training_command(gpus) == command
    (container,) = _pod(resources=contract.TrainingResources(gpus=gpus))["containers"]
    assert container["command"] == command


def test_the_manifest_is_a_pod_in_the_training_namespace_labelled_for_the_network_policy():
    manifest = contract.training_pod_manifest("retrain-20260101", IMAGE, [])
    assert manifest["kind"] == "Pod"
    assert manifest["metadata"]["namespace"] == contract.TRAINING_NAMESPACE
    assert manifest["metadata"]["labels"] == {contract.APP_LABEL: contract.TRAINING_APP}


@pytest.mark.parametrize("name", ["Retrain", "retrain_1", "-retrain", "r" * 64, ""])
def test_a_pod_name_that_is_not_a_dns_label_is_refused(name):
    with pytest.raises(ValueError, match="DNS label"):
        contract.training_pod_manifest(name, IMAGE, [])


@pytest.mark.parametrize(
    ("registry", "tag", "expected"),
    [
        ("registry.example.com", "0.1.0", "registry.example.com/mlops-fraud-training:0.1.0"),
        (
            "registry.example.com/team/",
            "sha-1a2b3c",
            "registry.example.com/team/mlops-fraud-training:sha-1a2b3c",
        ),
    ],
)
def test_training_image_reference(registry, tag, expected):
    assert contract.training_image(registry, tag) == expected


@pytest.mark.parametrize("tag", ["latest", ""])
def test_a_moving_or_missing_image_tag_is_refused(tag):
    with pytest.raises(ValueError, match="pin a version"):
        contract.training_image("registry.example.com", tag)


def test_importing_the_contract_pulls_in_no_heavy_or_cluster_client_module():
    """The retrain DAG imports it at parse time, where Airflow forbids heavy imports."""
    probe = (
        "import json, sys; import orchestration.k8s_contract; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('airflow', 'kubernetes', 'pydantic', 'yaml', 'torch', 'pyspark'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert json.loads(out) == []


# --- restricted Pod Security profile --------------------------------------------------------------------


def test_the_training_pod_passes_the_restricted_profile():
    assert contract.restricted_profile_violations(_pod()) == []


def _mutate_container(key, value):
    def mutate(spec):
        spec["containers"][0]["securityContext"][key] = value

    return mutate


def _set(path, value):
    def mutate(spec):
        target = spec
        for part in path[:-1]:
            target = target[part] if not isinstance(target, list) else target[int(part)]
        target[path[-1]] = value

    return mutate


def _drop(path):
    def mutate(spec):
        target = spec
        for part in path[:-1]:
            target = target[part] if not isinstance(target, list) else target[int(part)]
        del target[path[-1]]

    return mutate


def _add_volume(volume):
    def mutate(spec):
        spec["volumes"].append(volume)

    return mutate


def _add_sidecar(spec):
    sidecar = copy.deepcopy(spec["containers"][0])
    sidecar["name"] = "log-shipper"
    del sidecar["securityContext"]["capabilities"]
    spec["initContainers"] = [sidecar]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (_mutate_container("privileged", True), "privileged must be false"),
        (
            _drop(["containers", "0", "securityContext", "allowPrivilegeEscalation"]),
            "allowPrivilegeEscalation",
        ),
        (_mutate_container("allowPrivilegeEscalation", True), "allowPrivilegeEscalation"),
        (_mutate_container("runAsNonRoot", False), "runAsNonRoot must be true"),
        (_mutate_container("runAsUser", 0), "runAsUser must not be 0"),
        (_set(["securityContext", "runAsUser"], 0), "pod: runAsUser must not be 0"),
        (_mutate_container("capabilities", {"drop": ["NET_RAW"]}), "drop must include ALL"),
        (_mutate_container("capabilities", {"drop": ["ALL"], "add": ["SYS_ADMIN"]}), "NET_BIND_SERVICE"),
        (_set(["securityContext", "seccompProfile"], {"type": "Unconfined"}), "Unconfined"),
        (_drop(["securityContext", "seccompProfile"]), "seccompProfile.type must be RuntimeDefault"),
        (_mutate_container("procMount", "Unmasked"), "procMount"),
        (_mutate_container("seLinuxOptions", {"user": "system_u"}), "seLinuxOptions"),
        (_mutate_container("windowsOptions", {"hostProcess": True}), "hostProcess"),
        (_set(["hostNetwork"], True), "hostNetwork must be false"),
        (_set(["hostPID"], True), "hostPID must be false"),
        (_set(["containers", "0", "ports"], [{"containerPort": 80, "hostPort": 80}]), "hostPort 80"),
        (_add_volume({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}}), "hostPath"),
        (_set(["securityContext", "sysctls"], [{"name": "kernel.msgmax", "value": "1"}]), "kernel.msgmax"),
        (_add_sidecar, "initContainers log-shipper: capabilities.drop must include ALL"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_each_restricted_profile_rule_is_enforced(mutate, expected):
    spec = _pod()
    mutate(spec)
    violations = contract.restricted_profile_violations(spec)
    assert any(expected in violation for violation in violations), violations


def test_non_root_and_seccomp_may_be_set_per_container_instead_of_on_the_pod():
    spec = _pod()
    del spec["securityContext"]["runAsNonRoot"]
    del spec["securityContext"]["seccompProfile"]
    spec["containers"][0]["securityContext"]["seccompProfile"] = {"type": "RuntimeDefault"}
    assert contract.restricted_profile_violations(spec) == []


@pytest.mark.parametrize(
    ("kind", "obj"),
    [
        ("Pod", {"kind": "Pod", "spec": {"containers": []}}),
        ("Deployment", {"kind": "Deployment", "spec": {"template": {"spec": {"containers": []}}}}),
        (
            "CronJob",
            {
                "kind": "CronJob",
                "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": []}}}}},
            },
        ),
    ],
)
def test_workload_pod_spec_finds_the_pod_template(kind, obj):
    assert contract.workload_pod_spec(obj) == {"containers": []}, kind


def test_kinds_that_run_no_pods_have_no_pod_spec():
    assert contract.workload_pod_spec({"kind": "ConfigMap", "data": {}}) is None


# --- quantities and quota fit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "expected"),
    [
        ("500m", Fraction(1, 2)),
        ("2", Fraction(2)),
        (4, Fraction(4)),
        ("1.5", Fraction(3, 2)),
        ("24Gi", Fraction(24 * 1024**3)),
        ("128Mi", Fraction(128 * 1024**2)),
        ("1G", Fraction(10**9)),
        ("1e3", Fraction(1000)),
        ("250u", Fraction(1, 4000)),
    ],
)
def test_quantities_parse_exactly(quantity, expected):
    assert contract.parse_quantity(quantity) == expected


@pytest.mark.parametrize("quantity", ["12GB", "one", "", "1.5Zi"])
def test_a_malformed_quantity_is_refused(quantity):
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        contract.parse_quantity(quantity)


QUOTA = {
    "pods": "4",
    "requests.cpu": "8",
    "limits.cpu": "16",
    "requests.memory": "32Gi",
    "limits.memory": "32Gi",
    "requests.nvidia.com/gpu": "1",
}
LIMITS = [
    {
        "type": "Container",
        "default": {"cpu": "1", "memory": "2Gi"},
        "defaultRequest": {"cpu": "250m", "memory": "512Mi"},
        "max": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "1"},
    }
]


def test_the_default_training_pod_fits_a_one_gpu_quota():
    assert contract.quota_fit_violations(_pod(), QUOTA, LIMITS) == []


def test_a_pod_asking_for_more_gpus_than_the_quota_is_refused():
    violations = contract.quota_fit_violations(_pod(resources=contract.TrainingResources(gpus=2)), QUOTA)
    assert violations == ["ResourceQuota requests.nvidia.com/gpu: the pod needs 2, the quota allows 1"]


def test_a_container_above_the_limit_range_maximum_is_refused():
    violations = contract.quota_fit_violations(_pod(resources=contract.TrainingResources(gpus=2)), {}, LIMITS)
    assert "container trainer: limits.nvidia.com/gpu=2 exceeds LimitRange max 1" in violations


def test_a_pod_above_the_memory_quota_is_refused():
    violations = contract.quota_fit_violations(
        _pod(resources=contract.TrainingResources(memory="40Gi")), QUOTA
    )
    assert any(v.startswith("ResourceQuota requests.memory: the pod needs 42949672960") for v in violations)
    assert any(v.startswith("ResourceQuota limits.memory") for v in violations)


def test_a_container_without_limits_needs_a_limit_range_default_under_a_limits_quota():
    spec = _pod()
    spec["initContainers"] = [{"name": "fetch", "image": IMAGE}]
    assert "container fetch: limits.cpu unset under limits.cpu" in contract.quota_fit_violations(spec, QUOTA)
    assert contract.quota_fit_violations(spec, QUOTA, LIMITS) == []


def test_an_init_container_counts_by_its_peak_not_added_to_the_main_container():
    spec = _pod()
    spec["initContainers"] = [
        {"name": "warm", "image": IMAGE, "resources": {"requests": {"cpu": "6"}, "limits": {"cpu": "6"}}}
    ]
    assert contract.pod_resource_totals(spec, "requests")["cpu"] == 6
    assert contract.quota_fit_violations(spec, QUOTA, LIMITS) == []
    spec["initContainers"][0]["restartPolicy"] = "Always"  # a native sidecar runs alongside: it adds up
    assert contract.pod_resource_totals(spec, "requests")["cpu"] == 10
    assert (
        "ResourceQuota requests.cpu: the pod needs 10, the quota allows 8"
        in contract.quota_fit_violations(spec, QUOTA, LIMITS)
    )


def test_a_request_left_out_defaults_to_the_limit():
    container = {"name": "c", "resources": {"limits": {"cpu": "3"}}}
    assert contract.pod_resource_totals({"containers": [container]}, "requests") == {"cpu": 3}


def test_a_namespace_allowing_no_pods_refuses_the_pod():
    assert contract.quota_fit_violations(_pod(), {"pods": "0"}) == [
        "ResourceQuota pods: the pod needs 1, the quota allows 0"
    ]
