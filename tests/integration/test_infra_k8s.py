"""infra/k8s rendered for real and checked: the Kubernetes schema, the names contract, Pod Security, quota
fit, network reachability, the MLflow password guard, the Feast config, and checkov over all of infra/.

Tools: `kubectl kustomize` renders the overlays; kubernetes-validate (schemas of a pinned Kubernetes version,
shipped in its package) and checkov come from the infra tools venv, which the `infra_tools` fixture creates
or reuses through scripts/infra_tools.sh (in the user's cache, keyed by content), so a clean clone installs
them itself or reuses them. Nothing is fetched while testing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestration import k8s_contract as contract
from tests.integration.conftest import (
    DATA_SUBPATH_MOUNTS,
    DATA_VOLUME_WRITABLE,
    DATA_WRITABLE,
    INFRA,
    OVERLAYS,
    REPO,
    SCORING_LOG_SUBPATH,
    InfraTools,
    data_claim_mount_problems,
    data_claim_mounts,
    find,
    one,
    quota_and_limits,
    schema_errors,
)

NAMESPACES = {contract.ORCHESTRATION_NAMESPACE, contract.TRAINING_NAMESPACE, contract.SERVING_NAMESPACE}
# The label an operator puts on a namespace whose pods may call the scoring service (infra/README.md).
SCORING_CLIENT_LABEL = "mlops-fraud/scoring-client"
TRAINING_IMAGE = contract.training_image("registry.example.com", "0.1.0")
# Labels the official Airflow chart puts on a task pod; `tier: airflow` is on every pod of the release.
AIRFLOW_POD_LABELS = {"tier": "airflow", "component": "worker", "release": "airflow"}
METADATA_API = "169.254.169.254/32"
CLUSTER_SCOPED = ("Namespace", "PriorityClass", "PersistentVolume")


def workloads(objects) -> list[tuple[dict[str, Any], Any]]:
    return [(obj, spec) for obj in objects if (spec := contract.workload_pod_spec(obj)) is not None]


def training_manifest() -> dict[str, Any]:
    return contract.training_pod_manifest(
        "retrain-20260101", TRAINING_IMAGE, ["--interval-start", "2026-01-01"]
    )


# --- schema -----------------------------------------------------------------------------------------------


def test_there_are_overlays_to_check():
    assert {"dev", "prod"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates_against_the_kubernetes_schema(infra_tools, rendered, overlay):
    objects = rendered[overlay]
    assert len(objects) > 20
    assert schema_errors(infra_tools, objects) == []


def test_the_schema_check_catches_typos_wrong_types_and_unknown_kinds(infra_tools):
    pod = training_manifest()
    typo = json.loads(json.dumps(pod))
    typo["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    wrong_type = json.loads(json.dumps(pod))
    wrong_type["spec"]["containers"][0]["args"] = "--interval-start 2026-01-01"
    unknown = {"apiVersion": "mlops.example/v1", "kind": "Retrain", "metadata": {"name": "r"}}
    errors = schema_errors(infra_tools, [pod, typo, wrong_type, unknown])
    assert len(errors) == 3
    assert "readOnlyRootFilesytem" in errors[0]
    assert "is not of type 'array'" in errors[1]
    assert "Couldn't find schema for kind Retrain" in errors[2]


# --- names contract -------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_namespaces_are_the_contract_names_and_enforce_the_restricted_profile(rendered, overlay):
    namespaces = {
        ns["metadata"]["name"]: ns["metadata"]["labels"] for ns in find(rendered[overlay], "Namespace")
    }
    assert set(namespaces) == NAMESPACES
    for labels in namespaces.values():
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
        assert labels["pod-security.kubernetes.io/enforce-version"] == f"v{contract.KUBERNETES_VERSION}"
    namespaced = [obj for obj in rendered[overlay] if obj["kind"] not in CLUSTER_SCOPED]
    assert {obj["metadata"]["namespace"] for obj in namespaced} == NAMESPACES


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_training_identity_and_launcher_role_use_the_contract_names(rendered, overlay):
    objects = rendered[overlay]
    for account in (contract.TRAINING_SERVICE_ACCOUNT, contract.PROMOTER_SERVICE_ACCOUNT):
        identity = one(objects, "ServiceAccount", account, contract.TRAINING_NAMESPACE)
        assert identity["automountServiceAccountToken"] is False
        # The trainer's and the promoter's identities are granted nothing in the Kubernetes API.
        assert not [
            rb
            for rb in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding")
            if any(s["name"] == account for s in rb["subjects"])
        ]
    binding = one(objects, "RoleBinding", contract.TRAINING_LAUNCHER_ROLE, contract.TRAINING_NAMESPACE)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": contract.TRAINING_LAUNCHER_ROLE,
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": contract.AIRFLOW_WORKER_SERVICE_ACCOUNT,
            "namespace": contract.ORCHESTRATION_NAMESPACE,
        }
    ]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_triggerer_may_follow_the_pods_and_create_nothing(rendered, overlay):
    """KubernetesPodTrigger, in the triggerer, reads the deferred task's pod, its logs and events, and
    deletes the pod when the task is killed while deferred."""
    objects = rendered[overlay]
    binding = one(objects, "RoleBinding", contract.TRAINING_WATCHER_ROLE, contract.TRAINING_NAMESPACE)
    assert binding["roleRef"]["name"] == contract.TRAINING_WATCHER_ROLE
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": contract.AIRFLOW_TRIGGERER_SERVICE_ACCOUNT,
            "namespace": contract.ORCHESTRATION_NAMESPACE,
        }
    ]
    role = one(objects, "Role", contract.TRAINING_WATCHER_ROLE, contract.TRAINING_NAMESPACE)
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    assert {("pods", "get"), ("pods/log", "get"), ("events", "list"), ("pods", "delete")} <= granted
    assert not {verb for _, verb in granted} & {"create", "patch", "update", "*"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_launcher_role_is_least_privilege(rendered, overlay):
    role = one(rendered[overlay], "Role", contract.TRAINING_LAUNCHER_ROLE, contract.TRAINING_NAMESPACE)
    granted = {
        (resource, verb)
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
        if rule["apiGroups"] == [""]
    }
    assert all(rule["apiGroups"] == [""] for rule in role["rules"])
    assert {resource for resource, _ in granted} == {"pods", "pods/log", "events"}
    assert {verb for _, verb in granted} <= {"create", "get", "list", "watch", "delete", "patch"}
    assert not {("pods/exec", "create"), ("secrets", "get")} & granted
    assert "*" not in json.dumps(role["rules"])
    # What KubernetesPodOperator needs to run a pod, follow it and clean up.
    assert {("pods", "create"), ("pods", "watch"), ("pods", "delete"), ("pods/log", "get")} <= granted


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_priority_classes_are_the_contract_names_and_serving_outranks_training(rendered, overlay):
    classes = {pc["metadata"]["name"]: pc for pc in find(rendered[overlay], "PriorityClass")}
    assert set(classes) == {contract.TRAINING_PRIORITY_CLASS, contract.SERVING_PRIORITY_CLASS}
    assert (
        classes[contract.SERVING_PRIORITY_CLASS]["value"] > classes[contract.TRAINING_PRIORITY_CLASS]["value"]
    )
    assert classes[contract.TRAINING_PRIORITY_CLASS]["preemptionPolicy"] == "Never"
    assert not any(pc.get("globalDefault") for pc in classes.values())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_quota_and_limits_name_the_contract_gpu_resource(rendered, overlay):
    quota = one(rendered[overlay], "ResourceQuota", "training-compute", contract.TRAINING_NAMESPACE)
    assert f"requests.{contract.GPU_RESOURCE}" in quota["spec"]["hard"]
    (limit_range,) = find(rendered[overlay], "LimitRange", namespace=contract.TRAINING_NAMESPACE)
    container_limits = next(item for item in limit_range["spec"]["limits"] if item["type"] == "Container")
    assert contract.GPU_RESOURCE in container_limits["max"]
    # A default would hand every container in the namespace a GPU.
    assert contract.GPU_RESOURCE not in container_limits.get("default", {})
    assert contract.GPU_RESOURCE not in container_limits.get("defaultRequest", {})


# --- Pod Security and container hardening -----------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_passes_the_restricted_profile(rendered, overlay):
    found = workloads(rendered[overlay])
    assert {obj["metadata"]["name"] for obj, _ in found} >= {
        "mlflow",
        "feast-redis",
        "feast-feature-server",
        "fraud-scoring",
        "spark-master",
        "spark-worker",
        "spark-connect",
    }
    for obj, spec in found:
        assert contract.restricted_profile_violations(spec) == [], obj["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_container_is_hardened_sized_probed_and_pinned(rendered, overlay):
    for obj, spec in workloads(rendered[overlay]):
        assert spec["automountServiceAccountToken"] is False
        assert spec["securityContext"]["runAsUser"] >= 10000
        for field in ("initContainers", "containers"):
            for container in spec.get(field, []):
                where = f"{obj['metadata']['name']}/{container['name']}"
                assert container["securityContext"]["readOnlyRootFilesystem"] is True, where
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(container["resources"][kind]), where
                image = container["image"]
                assert ":" in image.rsplit("/", 1)[-1], f"{where}: image {image} has no tag"
                assert not image.endswith(":latest"), where
                if field == "containers":
                    assert "livenessProbe" in container, where
                    assert "readinessProbe" in container, where


def test_the_restricted_check_rejects_a_privileged_variant_of_a_rendered_workload(rendered):
    mlflow = one(rendered[OVERLAYS[0]], "Deployment", "mlflow")
    spec = json.loads(json.dumps(contract.workload_pod_spec(mlflow)))
    spec["containers"][0]["securityContext"]["privileged"] = True
    assert "containers mlflow: privileged must be false" in contract.restricted_profile_violations(spec)


# --- the training pod against the cluster objects ---------------------------------------------------------


def test_the_training_pod_validates_against_the_schema_and_the_restricted_profile(infra_tools):
    manifest = training_manifest()
    assert schema_errors(infra_tools, [manifest]) == []
    assert contract.restricted_profile_violations(manifest["spec"]) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_training_pod_fits_each_overlaysquota_and_limits(rendered, overlay):
    quota, limit_items = quota_and_limits(rendered[overlay])
    assert contract.quota_fit_violations(training_manifest()["spec"], quota, limit_items) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_pod_asking_for_more_gpus_than_the_quota_does_not_fit(rendered, overlay):
    quota, limit_items = quota_and_limits(rendered[overlay])
    too_many = int(contract.parse_quantity(quota[f"requests.{contract.GPU_RESOURCE}"])) + 1
    spec = contract.training_pod_spec(TRAINING_IMAGE, [], resources=contract.TrainingResources(gpus=too_many))
    violations = contract.quota_fit_violations(spec, quota, limit_items)
    assert f"ResourceQuota requests.{contract.GPU_RESOURCE}: the pod needs {too_many}" in " | ".join(
        violations
    )


def test_a_pod_with_more_gpus_than_one_container_may_hold_does_not_fit(rendered):
    quota, limit_items = quota_and_limits(rendered["prod"])
    container_max = next(item for item in limit_items if item["type"] == "Container")["max"]
    gpus = int(contract.parse_quantity(container_max[contract.GPU_RESOURCE])) + 1
    spec = contract.training_pod_spec(TRAINING_IMAGE, [], resources=contract.TrainingResources(gpus=gpus))
    violations = contract.quota_fit_violations(spec, quota, limit_items)
    assert f"container trainer: limits.{contract.GPU_RESOURCE}={gpus} exceeds LimitRange max" in " | ".join(
        violations
    )


def test_the_kubernetes_pod_operator_renders_the_contract_pod_unchanged(infra_tools, rendered):
    """What the retrain DAG will do: build the operator from the contract, and let it build the pod."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
    from kubernetes.client import ApiClient

    train = KubernetesPodOperator(
        task_id="train",
        namespace=contract.TRAINING_NAMESPACE,
        pod_template_dict=training_manifest(),
        base_container_name=contract.TRAINING_CONTAINER,
        do_xcom_push=False,
    )
    pod = ApiClient().sanitize_for_serialization(train.build_pod_request_obj(dry_run=True))

    assert schema_errors(infra_tools, [pod]) == []
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == contract.TRAINING_NAMESPACE
    assert pod["metadata"]["labels"][contract.APP_LABEL] == contract.TRAINING_APP
    assert spec["serviceAccountName"] == contract.TRAINING_SERVICE_ACCOUNT
    assert spec["priorityClassName"] == contract.TRAINING_PRIORITY_CLASS
    (container,) = spec["containers"]
    assert container["name"] == contract.TRAINING_CONTAINER
    assert container["command"] == list(contract.TRAINING_COMMAND)
    assert container["resources"]["limits"][contract.GPU_RESOURCE] == "1"
    assert contract.restricted_profile_violations(spec) == []
    for overlay in OVERLAYS:
        quota, limit_items = quota_and_limits(rendered[overlay])
        assert contract.quota_fit_violations(spec, quota, limit_items) == [], overlay


# --- network reachability -------------------------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert not selector.get("matchExpressions"), "extend _selects before using matchExpressions"
    return all(labels.get(key) == value for key, value in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer, policy_ns, namespace_labels, src_ns, src_labels) -> bool:
    if "ipBlock" in peer:
        return False
    if "namespaceSelector" in peer:
        if not _selects(peer["namespaceSelector"], namespace_labels[src_ns]):
            return False
    elif src_ns != policy_ns:
        return False
    return _selects(peer.get("podSelector") or {}, src_labels)


def _isolating(objects, policy_type: str, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """The specs of the policies of `policy_type` (Ingress or Egress) that select the pod."""
    return [
        policy["spec"]
        for policy in find(objects, "NetworkPolicy", namespace=namespace)
        if policy_type in policy["spec"]["policyTypes"] and _selects(policy["spec"]["podSelector"], labels)
    ]


def _allowed(objects, direction, at_ns, at_labels, peer_ns, peer_labels, port) -> bool:
    """Whether the policies selecting (at_ns, at_labels) let traffic through in `direction` to or from the
    in-cluster peer on this TCP port. A pod no policy of that direction selects is not isolated (a namespace
    without policies, such as a caller's); every namespace here is default-deny, so absent a rule it is
    refused."""
    # The API server adds kubernetes.io/metadata.name to every namespace; the manifests do not carry it.
    namespace_labels = {
        ns["metadata"]["name"]: {
            **ns["metadata"]["labels"],
            "kubernetes.io/metadata.name": ns["metadata"]["name"],
        }
        for ns in find(objects, "Namespace")
    }
    policy_type, peers_key = ("Ingress", "from") if direction == "ingress" else ("Egress", "to")
    isolating = _isolating(objects, policy_type, at_ns, at_labels)
    if not isolating:
        return True
    for spec in isolating:
        for rule in spec.get(direction, []):
            ports = rule.get("ports")
            if ports is not None and not any(p.get("port") == port and p["protocol"] == "TCP" for p in ports):
                continue
            peers = rule.get(peers_key)
            if peers is None or any(
                _peer_matches(p, at_ns, namespace_labels, peer_ns, peer_labels) for p in peers
            ):
                return True
    return False


def _reachable(objects, src, dst, port) -> bool:
    (src_ns, src_labels), (dst_ns, dst_labels) = src, dst
    return _allowed(objects, "egress", src_ns, src_labels, dst_ns, dst_labels, port) and _allowed(
        objects, "ingress", dst_ns, dst_labels, src_ns, src_labels, port
    )


def _pod_labels(objects, name) -> tuple[str, dict[str, str]]:
    (deployment,) = find(objects, "Deployment", name)
    return deployment["metadata"]["namespace"], deployment["spec"]["template"]["metadata"]["labels"]


def _service_port(objects, name) -> int:
    (service,) = find(objects, "Service", name)
    (port,) = service["spec"]["ports"]
    return port["port"]


def _container_port(objects, name) -> int:
    """The port a NetworkPolicy sees: the pod's, behind the Service's named targetPort."""
    (service,) = find(objects, "Service", name)
    (port,) = service["spec"]["ports"]
    (deployment,) = find(objects, "Deployment", name)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (target,) = [p for p in container["ports"] if p["name"] == port["targetPort"]]
    return target["containerPort"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_namespace_denies_all_traffic_by_default(rendered, overlay):
    for namespace in NAMESPACES:
        (deny,) = find(rendered[overlay], "NetworkPolicy", "default-deny", namespace)
        assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_needed_paths_are_open_and_nothing_else_between_the_services(rendered, overlay):
    objects = rendered[overlay]
    trainer = (contract.TRAINING_NAMESPACE, training_manifest()["metadata"]["labels"])
    airflow = (contract.ORCHESTRATION_NAMESPACE, AIRFLOW_POD_LABELS)
    mlflow = _pod_labels(objects, "mlflow")
    redis = _pod_labels(objects, "feast-redis")
    feature_server = _pod_labels(objects, "feast-feature-server")
    mlflow_port = _container_port(objects, "mlflow")
    redis_port = _container_port(objects, "feast-redis")

    assert _reachable(objects, trainer, mlflow, mlflow_port)
    assert _reachable(objects, airflow, mlflow, mlflow_port)
    assert _reachable(objects, airflow, redis, redis_port)
    assert _reachable(objects, feature_server, redis, redis_port)
    # Spark: the tasks reach the Connect server; it and the Workers reach the Master and each other (the
    # executors' connections to the driver use Spark's own ports); training pods reach none of them.
    connect = _pod_labels(objects, "spark-connect")
    spark_master = _pod_labels(objects, "spark-master")
    spark_worker = _pod_labels(objects, "spark-worker")
    connect_port = _container_port(objects, "spark-connect")
    assert _reachable(objects, airflow, connect, connect_port)
    assert _reachable(objects, connect, spark_master, 7077) and _reachable(
        objects, spark_worker, spark_master, 7077
    )
    assert _reachable(objects, spark_worker, connect, 40123) and _reachable(
        objects, connect, spark_worker, 40123
    )
    assert not _reachable(objects, trainer, connect, connect_port)

    assert not _reachable(objects, trainer, redis, redis_port)
    assert not _reachable(objects, trainer, feature_server, _container_port(objects, "feast-feature-server"))
    assert not _reachable(objects, mlflow, trainer, 8080)
    assert not _reachable(objects, airflow, trainer, 8080)
    # A pod the training task did not launch (other labels) gets none of the trainer's allowances.
    stray = (contract.TRAINING_NAMESPACE, {"app.kubernetes.io/name": "debug"})
    assert not _reachable(objects, stray, mlflow, mlflow_port)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scoring_service_reaches_redis_and_mlflow_and_answers_only_its_callers(rendered, overlay):
    # Two namespaces of callers: one labelled as the scoring service's client, one not.
    clients = [
        {"kind": "Namespace", "metadata": {"name": "payments", "labels": {SCORING_CLIENT_LABEL: "true"}}},
        {"kind": "Namespace", "metadata": {"name": "elsewhere", "labels": {}}},
    ]
    objects = rendered[overlay] + clients
    scoring = _pod_labels(objects, "fraud-scoring")
    scoring_port = _container_port(objects, "fraud-scoring")
    redis = _pod_labels(objects, "feast-redis")
    mlflow = _pod_labels(objects, "mlflow")
    assert scoring_port == _service_port(objects, "fraud-scoring") == 8000

    assert _reachable(objects, scoring, redis, _container_port(objects, "feast-redis"))
    assert _reachable(objects, scoring, mlflow, _container_port(objects, "mlflow"))
    assert _reachable(objects, ("payments", {"app": "authoriser"}), scoring, scoring_port)

    assert not _reachable(objects, ("elsewhere", {"app": "authoriser"}), scoring, scoring_port)
    assert not _reachable(objects, ("payments", {"app": "authoriser"}), scoring, 9090)
    assert not _reachable(objects, scoring, _pod_labels(objects, "feast-feature-server"), 6566)
    trainer = (contract.TRAINING_NAMESPACE, training_manifest()["metadata"]["labels"])
    assert not _reachable(objects, trainer, scoring, scoring_port)
    assert not _reachable(
        objects, (contract.ORCHESTRATION_NAMESPACE, AIRFLOW_POD_LABELS), scoring, scoring_port
    )
    # Another pod of the serving namespace gets none of the scoring service's allowances.
    stray = (contract.SERVING_NAMESPACE, {"app.kubernetes.io/name": "debug"})
    assert not _reachable(objects, stray, mlflow, _container_port(objects, "mlflow"))
    assert not _reachable(objects, stray, redis, _container_port(objects, "feast-redis"))


def _egress_to_ip_blocks(objects, namespace, labels) -> set[tuple[str, int]]:
    allowed = set()
    for policy in find(objects, "NetworkPolicy", namespace=namespace):
        if "Egress" in policy["spec"]["policyTypes"] and _selects(policy["spec"]["podSelector"], labels):
            for rule in policy["spec"].get("egress", []):
                for peer in rule.get("to", []):
                    if "ipBlock" in peer:
                        block = peer["ipBlock"]
                        # The cloud metadata API hands out the node's credentials; no pod here may reach it.
                        metadata = ipaddress.ip_address(METADATA_API.split("/")[0])
                        open_to_metadata = metadata in ipaddress.ip_network(block["cidr"]) and not any(
                            metadata in ipaddress.ip_network(e) for e in block.get("except", [])
                        )
                        assert not open_to_metadata, (
                            f"{policy['metadata']['name']} lets pods reach {METADATA_API}"
                        )
                        allowed |= {(block["cidr"], port["port"]) for port in rule["ports"]}
    return allowed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_outside_the_cluster_only_postgres_and_object_storage_are_reachable(rendered, overlay):
    objects = rendered[overlay]
    trainer_labels = training_manifest()["metadata"]["labels"]
    # PostgreSQL: the promote step's promotion history; 443: object storage, when used instead of the volume.
    assert {
        port for _, port in _egress_to_ip_blocks(objects, contract.TRAINING_NAMESPACE, trainer_labels)
    } == {443, 5432}
    mlflow_ns, mlflow_labels = _pod_labels(objects, "mlflow")
    assert {port for _, port in _egress_to_ip_blocks(objects, mlflow_ns, mlflow_labels)} == {443, 5432}
    airflow_blocks = _egress_to_ip_blocks(objects, contract.ORCHESTRATION_NAMESPACE, AIRFLOW_POD_LABELS)
    airflow_ports = {port for _, port in airflow_blocks}
    assert airflow_ports == {443, 5432, 6443}
    feast_ns, feast_labels = _pod_labels(objects, "feast-redis")
    assert _egress_to_ip_blocks(objects, feast_ns, feast_labels) == set()
    # The feature server reads its registry from the mounted volume: nothing outside the cluster.
    server_ns, server_labels = _pod_labels(objects, "feast-feature-server")
    assert _egress_to_ip_blocks(objects, server_ns, server_labels) == set()
    # The scoring service: the promotion history's PostgreSQL alone (read-only login: it serves the champion
    # the history records); no object storage, no internet.
    scoring_ns, scoring_labels = _pod_labels(objects, "fraud-scoring")
    assert {port for _, port in _egress_to_ip_blocks(objects, scoring_ns, scoring_labels)} == {5432}
    # Spark: object storage alone (a lake there); its Master, Workers and driver talk inside the namespace.
    for name in ("spark-master", "spark-worker", "spark-connect"):
        spark_ns, spark_labels = _pod_labels(objects, name)
        assert {port for _, port in _egress_to_ip_blocks(objects, spark_ns, spark_labels)} == {443}, name


def _reaches_address(objects, pod, address: str, port: int) -> bool:
    """Whether the policies selecting `pod` (namespace, labels) let it out to `address` (outside the cluster)
    on this TCP port: an ipBlock holds the address and none of its `except` ranges does."""
    ip = ipaddress.ip_address(address)
    isolating = _isolating(objects, "Egress", *pod)
    if not isolating:
        return True
    for spec in isolating:
        for rule in spec.get("egress", []):
            ports = rule.get("ports")
            if ports is not None and not any(p.get("port") == port and p["protocol"] == "TCP" for p in ports):
                continue
            if rule.get("to") is None:
                return True
            for block in (peer["ipBlock"] for peer in rule["to"] if "ipBlock" in peer):
                if ip in ipaddress.ip_network(block["cidr"]) and not any(
                    ip in ipaddress.ip_network(excluded) for excluded in block.get("except", [])
                ):
                    return True
    return False


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rendered_alert_egress_admits_the_configured_channels_from_every_sender_and_nothing_more(
    infra_tools, rendered, overlay
):
    """The issue's observation: the base policies let no pod that alerts reach a mail relay on 587 or a
    webhook on its own port. `mlops alert-egress` renders, from the alert settings, the policies that admit
    exactly those (valid objects of the schema), from Airflow's pods, the trainer's and the scoring
    service's."""
    from core.settings import AlertSettings
    from orchestration.alert_egress import egress_policies

    objects = rendered[overlay]
    senders = [
        (contract.ORCHESTRATION_NAMESPACE, AIRFLOW_POD_LABELS),
        (contract.TRAINING_NAMESPACE, training_manifest()["metadata"]["labels"]),
        _pod_labels(objects, "fraud-scoring"),
    ]
    alerts = AlertSettings(
        email_to=["risk-team@example.com"], smtp_host="192.0.2.25", smtp_port=587,
        webhook_url="https://198.51.100.7:8443/hooks/mlops",
    )  # fmt: skip
    channels = [("192.0.2.25", 587), ("198.51.100.7", 8443)]
    for sender in senders:
        assert not any(_reaches_address(objects, sender, *channel) for channel in channels), sender

    policies = egress_policies(alerts)
    assert schema_errors(infra_tools, policies) == []
    admitted = objects + policies
    for sender in senders:
        assert all(_reaches_address(admitted, sender, *channel) for channel in channels), sender
        assert not _reaches_address(admitted, sender, "192.0.2.25", 25)  # only the configured port
        assert not _reaches_address(admitted, sender, "192.0.2.26", 587)  # only the configured address
        assert not _reaches_address(admitted, sender, "198.51.100.7", 587)  # not each other's port
        stray = (sender[0], {"app.kubernetes.io/name": "debug"})
        assert not _reaches_address(admitted, stray, "192.0.2.25", 587)

    # A relay whose addresses change: its port to any address, never to the cloud metadata endpoint.
    anywhere = objects + egress_policies(alerts, any_address=True)
    assert schema_errors(infra_tools, egress_policies(alerts, any_address=True)) == []
    for sender in senders:
        assert _reaches_address(anywhere, sender, "203.0.113.9", 587)
        assert _reaches_address(anywhere, sender, "2001:db8::25", 8443)
        assert not _reaches_address(anywhere, sender, "169.254.169.254", 587)
        assert not _reaches_address(anywhere, sender, "203.0.113.9", 25)


# --- MLflow ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mlflow_runs_basic_auth_on_postgres_and_serves_artifacts_from_the_shared_volume(rendered, overlay):
    mlflow = one(rendered[overlay], "Deployment", "mlflow", contract.ORCHESTRATION_NAMESPACE)
    spec = mlflow["spec"]["template"]["spec"]
    (server,) = spec["containers"]
    assert server["image"].startswith("ghcr.io/mlflow/mlflow:v")
    assert server["command"] == ["mlflow", "server"]
    assert "--app-name=basic-auth" in server["args"]
    assert "--backend-store-uri=$(MLFLOW_BACKEND_STORE_URI)" in server["args"]
    env = {item["name"]: item for item in server["env"]}
    assert env["MLFLOW_BACKEND_STORE_URI"]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-backend"
    assert env["MLFLOW_AUTH_ADMIN_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "mlflow-admin",
        "key": "admin-password",
    }
    # Artifacts go through the server (clients need no storage access) to the mounted artifact folder.
    assert "--serve-artifacts" in server["args"]
    assert "--artifacts-destination=$(MLFLOW_ARTIFACTS_DESTINATION)" in server["args"]
    config = one(rendered[overlay], "ConfigMap", "mlflow-config", contract.ORCHESTRATION_NAMESPACE)
    assert env["MLFLOW_ARTIFACTS_DESTINATION"]["valueFrom"]["configMapKeyRef"] == {
        "name": "mlflow-config",
        "key": "artifacts-destination",
    }
    destination = config["data"]["artifacts-destination"]
    (mount,) = [m for m in server["volumeMounts"] if m["mountPath"] == destination]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    assert volume["persistentVolumeClaim"]["claimName"] == contract.DATA_CLAIM
    assert mount.get("subPath") == contract.MLFLOW_ARTIFACTS_SUBPATH
    assert not mount.get("readOnly") and not volume["persistentVolumeClaim"].get("readOnly")
    # The guard sees the same password the server does.
    (guard,) = spec["initContainers"]
    guard_env = {item["name"]: item for item in guard["env"]}
    assert guard_env["MLFLOW_AUTH_ADMIN_PASSWORD"] == env["MLFLOW_AUTH_ADMIN_PASSWORD"]
    assert guard_env["MLFLOW_AUTH_CONFIG_PATH"] == env["MLFLOW_AUTH_CONFIG_PATH"]


AUTH_INI = """[mlflow]
default_permission = READ
database_uri = postgresql://mlflow_auth@db:5432/mlflow_auth
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
"""


@pytest.mark.parametrize(
    ("env_password", "ini_password", "accepted"),
    [
        ("password1234", None, False),
        ("", "a-strong-password-in-the-ini", False),  # an empty variable wins over the file, as in MLflow
        ("correct-horse", None, False),
        (None, "password1234", False),
        (None, None, False),
        ("n4W2-q8Vd-Jr7p-Xc3L", None, True),
        (None, "n4W2-q8Vd-Jr7p-Xc3L", True),
    ],
)
def test_the_mlflow_guard_refuses_the_default_or_a_weak_admin_password(
    rendered, tmp_path, env_password, ini_password, accepted
):
    mlflow = one(rendered["prod"], "Deployment", "mlflow", contract.ORCHESTRATION_NAMESPACE)
    (guard,) = mlflow["spec"]["template"]["spec"]["initContainers"]
    assert guard["command"][:2] == ["python", "-c"]
    ini = tmp_path / "basic_auth.ini"
    ini.write_text(AUTH_INI + (f"admin_password = {ini_password}\n" if ini_password else ""))
    env = {key: value for key, value in os.environ.items() if key != "MLFLOW_AUTH_ADMIN_PASSWORD"}
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(ini)
    if env_password is not None:
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = env_password
    done = subprocess.run(
        [sys.executable, "-c", guard["command"][2]], env=env, capture_output=True, text=True, timeout=60
    )
    if accepted:
        assert done.returncode == 0, done.stderr
    else:
        assert done.returncode == 1
        assert "refusing to start MLflow" in done.stderr
        assert "mlflow-admin" in done.stderr


# --- the shared filesystem (infra/README.md, "Storage") ---------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_namespace_has_the_data_claim_bound_to_its_own_volume_of_one_export(rendered, overlay):
    objects = rendered[overlay]
    volumes = {pv["metadata"]["name"]: pv["spec"] for pv in find(objects, "PersistentVolume")}
    assert set(contract.DATA_VOLUMES.values()) <= set(volumes)
    assert set(contract.DATA_VOLUMES) == NAMESPACES == set(DATA_WRITABLE) == set(DATA_VOLUME_WRITABLE)
    exports = set()
    for namespace, volume_name in contract.DATA_VOLUMES.items():
        claim = one(objects, "PersistentVolumeClaim", contract.DATA_CLAIM, namespace)["spec"]
        volume = volumes[volume_name]
        mode = ["ReadWriteMany"] if DATA_VOLUME_WRITABLE[namespace] else ["ReadOnlyMany"]
        assert claim["accessModes"] == volume["accessModes"] == mode, namespace
        # Bound both ways, statically: no provisioner makes an empty volume, no other claim takes this one.
        assert claim["volumeName"] == volume_name
        assert volume["claimRef"] == {"namespace": namespace, "name": contract.DATA_CLAIM}
        assert claim["storageClassName"] == volume["storageClassName"] == ""
        assert volume["persistentVolumeReclaimPolicy"] == "Retain"
        requested = contract.parse_quantity(claim["resources"]["requests"]["storage"])
        assert requested <= contract.parse_quantity(volume["capacity"]["storage"])
        # Read-only on the volume itself where the namespace only reads, whatever a pod asks for.
        assert volume["nfs"].get("readOnly", False) is not DATA_VOLUME_WRITABLE[namespace], namespace
        exports.add((volume["nfs"]["server"], volume["nfs"]["path"]))
    assert len(exports) == 1, f"the volumes must all be the one export, not {sorted(exports)}"


def _airflow_pod_spec() -> dict[str, Any]:
    """What the Airflow chart makes of values.yaml's global volumes, volumeMounts and env, per container."""
    values = yaml.safe_load((INFRA / "helm" / "airflow" / "values.yaml").read_text())
    container = {"name": "airflow", "volumeMounts": values["volumeMounts"], "env": values["env"]}
    return {"volumes": values["volumes"], "containers": [container]}


def _batch_scoring_pod() -> dict[str, Any]:
    """The pod the batch scoring DAG's task runs under the cluster profile (dags/score_fraud_batch.py)."""
    from core.settings import Settings
    from orchestration.tasks import BATCH_SCORING_COMMAND, cpu_pod_operator

    operator = cpu_pod_operator(
        Settings(profile="cluster"),
        "score",
        "fraud-batch-score",
        BATCH_SCORING_COMMAND,
        ["--date", "2026-01-08", "--version", ""],
        writable=["lake/decisions"],
    )
    return operator.pod_template_dict


def _pods_mounting_the_data_claim(objects) -> dict[str, tuple[str, dict[str, Any]]]:
    pods = {"airflow (Helm)": (contract.ORCHESTRATION_NAMESPACE, _airflow_pod_spec())}
    pods["training pod (contract)"] = (contract.TRAINING_NAMESPACE, training_manifest()["spec"])
    pods["batch scoring pod"] = (contract.TRAINING_NAMESPACE, _batch_scoring_pod()["spec"])
    for obj, spec in workloads(objects):
        pods[obj["metadata"]["name"]] = (obj["metadata"]["namespace"], spec)
    return {name: pod for name, pod in pods.items() if data_claim_mounts(pod[1])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_mounting_the_shared_filesystem_mounts_it_where_and_how_the_design_says(rendered, overlay):
    pods = _pods_mounting_the_data_claim(rendered[overlay])
    assert {
        "airflow (Helm)",
        "mlflow",
        "feast-feature-server",
        "fraud-scoring",
        "training pod (contract)",
        "batch scoring pod",
        # Spark's executors and its driver (the Connect server) read and write the lake.
        "spark-worker",
        "spark-connect",
    } <= set(pods)
    for name, (namespace, spec) in pods.items():
        assert data_claim_mount_problems(namespace, spec) == [], name


def test_the_mount_check_catches_a_writable_serving_mount_and_a_wrong_path(rendered):
    pods = _pods_mounting_the_data_claim(rendered["prod"])
    namespace, spec = pods["feast-feature-server"]
    writable = json.loads(json.dumps(spec))
    (_, volume, mount) = data_claim_mounts(writable)[0]
    mount["readOnly"] = False
    del volume["persistentVolumeClaim"]["readOnly"]
    assert len(data_claim_mount_problems(namespace, writable)) == 2
    # The scoring pod: its /mlops mount made writable, or a writable subPath other than the scoring log.
    namespace, spec = pods["fraud-scoring"]
    whole = json.loads(json.dumps(spec))
    (mount,) = [m for _, _, m in data_claim_mounts(whole) if m["mountPath"] == contract.DATA_MOUNT]
    mount["readOnly"] = False
    assert data_claim_mount_problems(namespace, whole) == [
        f"{namespace} scoring: {contract.DATA_MOUNT}: must be mounted readOnly in {namespace}"
    ]
    lake = json.loads(json.dumps(spec))
    (mount,) = [m for _, _, m in data_claim_mounts(lake) if m.get("subPath")]
    mount.update(subPath="lake", mountPath=f"{contract.DATA_MOUNT}/lake")
    problems = data_claim_mount_problems(namespace, lake)
    assert (
        f"{namespace} scoring: {contract.DATA_MOUNT}/lake: must be mounted readOnly in {namespace}"
        in problems
    )
    assert any("subPath lake is not one of" in problem for problem in problems), problems
    # Nothing then needs the pod's volume of the claim writable: both its mounts say so.
    assert sum("persistentVolumeClaim must be readOnly" in problem for problem in problems) == 2
    moved = json.loads(json.dumps(_airflow_pod_spec()))
    moved["containers"][0]["volumeMounts"][0]["mountPath"] = "/data"
    problems = data_claim_mount_problems(contract.ORCHESTRATION_NAMESPACE, moved)
    assert any(f"must be mounted at {contract.DATA_MOUNT}" in p for p in problems), problems
    assert any("MLOPS_HOME" in p for p in problems), problems


# --- the scoring service ------------------------------------------------------------------------------------


def _probe_path(container: dict[str, Any], probe: str) -> tuple[str, str]:
    get = container[probe]["httpGet"]
    return get["path"], get["port"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scoring_service_is_hardened_replicas_rolled_without_an_outage_probed_on_the_protocols_health(
    rendered, overlay
):
    objects = rendered[overlay]
    deployment = one(objects, "Deployment", "fraud-scoring", contract.SERVING_NAMESPACE)
    # Two replicas or more sharing one ordered log (serving/replication.py), rolled one at a time: a new pod
    # is ready only once it has caught up, and no ready pod is taken away before it is.
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    (budget,) = [
        pdb for pdb in find(objects, "PodDisruptionBudget") if _selects(pdb["spec"]["selector"], labels)
    ]
    assert budget["spec"] == {"minAvailable": 1, "selector": budget["spec"]["selector"]}
    assert budget["metadata"]["namespace"] == contract.SERVING_NAMESPACE
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    environment = {e["name"]: e.get("value") for e in container["env"]}
    assert environment["MLOPS_SERVING__REPLICATED"] == "true", "replicas without the log would diverge"
    spec = deployment["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == contract.SERVING_PRIORITY_CLASS
    assert spec["serviceAccountName"] == "fraud-scoring"
    assert (
        one(objects, "ServiceAccount", "fraud-scoring", contract.SERVING_NAMESPACE)[
            "automountServiceAccountToken"
        ]
        is False
    )
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": contract.TRAINING_UID,
        "runAsGroup": contract.TRAINING_UID,
        "fsGroup": contract.TRAINING_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = spec["containers"]
    assert container["image"].rsplit(":", 1)[0].endswith("/mlops-fraud-scoring")
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # Ready only with a champion loaded; live while the process answers (also before the first champion).
    assert _probe_path(container, "readinessProbe") == ("/v2/health/ready", "http")
    assert _probe_path(container, "livenessProbe") == ("/v2/health/live", "http")
    assert _probe_path(container, "startupProbe") == ("/v2/health/live", "http")
    (port,) = container["ports"]
    assert (port["name"], port["containerPort"]) == ("http", 8000)
    assert container["command"][-2:] == ["--port", str(port["containerPort"])]
    service = one(objects, "Service", "fraud-scoring", contract.SERVING_NAMESPACE)["spec"]
    assert service["selector"] == {contract.APP_LABEL: "fraud-scoring"}
    assert service["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    # The read-only root: /tmp is a size-limited emptyDir.
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    (tmp,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "sizeLimit" in volumes[tmp["name"]]["emptyDir"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_scoring_service_writes_only_its_log_on_the_shared_filesystem(rendered, overlay):
    """/mlops read-only (silver tables, Feast registry), and the scoring log's folder alone read-write: a
    subPath mount of the same claim, at the path the settings put it (Settings.scoring_log_dir)."""
    from core.settings import Settings

    deployment = one(rendered[overlay], "Deployment", "fraud-scoring", contract.SERVING_NAMESPACE)
    spec = deployment["spec"]["template"]["spec"]
    mounts = {mount["mountPath"]: (volume, mount) for _, volume, mount in data_claim_mounts(spec)}
    log_dir = str(Settings(home=Path(contract.DATA_MOUNT)).scoring_log_dir)
    assert set(mounts) == {contract.DATA_MOUNT, log_dir}
    assert mounts[contract.DATA_MOUNT][1]["readOnly"] is True
    volume, log = mounts[log_dir]
    assert log["subPath"] == SCORING_LOG_SUBPATH and DATA_SUBPATH_MOUNTS[SCORING_LOG_SUBPATH] == log_dir
    # Writable: neither the mount nor the pod's volume of the claim read-only (that would win over the mount).
    assert not log.get("readOnly") and not volume["persistentVolumeClaim"].get("readOnly")
    assert data_claim_mount_problems(contract.SERVING_NAMESPACE, spec) == []


# What only the writers (Airflow's tasks) need in features/feature_store.cluster.yaml: the atomic registry
# writer, the dedup switch for materialisation, the offline store and the project's description.
FEAST_WRITER_ONLY = {
    "project_description": None,
    "offline_store": None,
    "registry": "registry_store_type",
    "online_store": "skip_dedup",
}


def _without_writer_only(config: dict[str, Any]) -> dict[str, Any]:
    config = json.loads(json.dumps(config))
    for key, inner in FEAST_WRITER_ONLY.items():
        if inner is None:
            config.pop(key, None)
        else:
            config[key].pop(inner, None)
    return config


def test_the_feature_servers_config_is_what_the_code_renders_for_the_shared_filesystem(rendered, monkeypatch):
    """The feature server reads the registry the features DAG writes, for the project it writes, from the
    Redis the materialisation fills: its ConfigMap against features/repo.py rendering the cluster profile's
    Feast config with MLOPS_HOME at the shared filesystem's mount."""
    from core.settings import ClusterServices, Profile, Settings
    from features.repo import DEFAULT_PROJECT, render_config

    for name in [name for name in os.environ if name.startswith("MLOPS_")]:
        monkeypatch.delenv(name)
    redis_port = _service_port(rendered["prod"], "feast-redis")
    redis_host = f"feast-redis.{contract.SERVING_NAMESPACE}.svc.cluster.local"
    settings = Settings(
        profile=Profile.CLUSTER,
        home=Path(contract.DATA_MOUNT),
        cluster=ClusterServices(redis_url=f"redis://:from-the-secret@{redis_host}:{redis_port}/0"),
    )
    code = yaml.safe_load(render_config(settings))
    assert code["registry"]["path"] == str(settings.feast_dir / "registry.db") == contract.FEAST_REGISTRY_PATH
    for overlay in OVERLAYS:
        config_map = one(rendered[overlay], "ConfigMap", "feast-feature-store", contract.SERVING_NAMESPACE)
        text = config_map["data"]["feature_store.yaml"]
        served = yaml.safe_load(text.replace("${REDIS_PASSWORD}", "from-the-secret"))
        assert served["project"] == DEFAULT_PROJECT, overlay
        assert served["registry"] == {
            "registry_type": "file",
            "path": contract.FEAST_REGISTRY_PATH,
            "cache_ttl_seconds": code["registry"]["cache_ttl_seconds"],
        }, overlay
        assert served["online_store"]["connection_string"].startswith(f"{redis_host}:{redis_port},"), overlay
        assert served == _without_writer_only(code), overlay


# --- Feast -------------------------------------------------------------------------------------------------

FEAST_LOADER = """
import json, sys
from pathlib import Path
from feast.repo_config import load_repo_config
out = {}
for repo in sys.argv[1:]:
    try:
        config = load_repo_config(Path(repo), Path(repo) / "feature_store.yaml")
    except Exception as exc:  # reported per overlay, the test names the failure
        out[repo] = {"error": f"{type(exc).__name__}: {exc}"}
        continue
    out[repo] = {
        "project": config.project,
        "online_store": type(config.online_store).__name__,
        "connection_string": config.online_store.connection_string,
        "registry": config.registry.path,
    }
print(json.dumps(out))
"""


def test_the_feature_servers_config_is_a_valid_feast_config_pointing_at_the_redis_service(rendered, tmp_path):
    repos = {}
    for overlay in OVERLAYS:
        config_map = one(rendered[overlay], "ConfigMap", "feast-feature-store", contract.SERVING_NAMESPACE)
        repos[overlay] = tmp_path / overlay
        repos[overlay].mkdir()
        (repos[overlay] / "feature_store.yaml").write_text(config_map["data"]["feature_store.yaml"])
    # The same file with one misspelt key, to show the loader is strict.
    broken = tmp_path / "broken"
    broken.mkdir()
    text = (repos[OVERLAYS[0]] / "feature_store.yaml").read_text()
    (broken / "feature_store.yaml").write_text(text.replace("connection_string", "conection_string"))

    env = {**os.environ, "REDIS_PASSWORD": "from-the-secret"}
    done = subprocess.run(
        [sys.executable, "-c", FEAST_LOADER, *map(str, repos.values()), str(broken)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    redis_port = _service_port(rendered["prod"], "feast-redis")
    redis_host = f"feast-redis.{contract.SERVING_NAMESPACE}.svc.cluster.local:{redis_port}"
    for overlay, repo in repos.items():
        config = loaded[str(repo)]
        assert "error" not in config, f"{overlay}: {config}"
        assert config["online_store"] == "RedisOnlineStoreConfig"
        assert config["connection_string"] == f"{redis_host},db=0,password=from-the-secret"
        assert config["registry"] == contract.FEAST_REGISTRY_PATH
    assert "extra_forbidden" in loaded[str(broken)]["error"]


# --- checkov -----------------------------------------------------------------------------------------------


def _checkov(tools: InfraTools, target: Path, frameworks: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(tools.checkov), "-d", str(target), "--framework", *frameworks, "--skip-download", "-o", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    report = json.loads(done.stdout)
    # One framework with findings gives an object, several a list, none a bare summary.
    return [report] if isinstance(report, dict) else report


@pytest.fixture(scope="session")
def checkov_infra(infra_tools, kubectl) -> dict[str, dict[str, Any]]:
    reports = _checkov(infra_tools, INFRA, ["kubernetes", "kustomize", "dockerfile", "helm", "secrets"])
    return {report["check_type"]: report for report in reports if "check_type" in report}


def test_checkov_finds_no_failed_check_in_infra(checkov_infra):
    failed = [
        f"{report['check_type']}: {check['check_id']} {check['check_name']} in {check['file_path']}"
        f" ({check.get('resource')})"
        for report in checkov_infra.values()
        for check in report["results"]["failed_checks"]
    ]
    assert failed == []


def test_checkov_really_scanned_the_manifests_the_overlays_and_the_dockerfiles(checkov_infra):
    assert {"kubernetes", "kustomize", "dockerfile"} <= set(checkov_infra)
    for check_type in ("kubernetes", "kustomize", "dockerfile"):
        assert checkov_infra[check_type]["summary"]["passed"] > 50, check_type
    overlays_scanned = {
        check["file_path"].split("/overlays/")[1].split("/")[0]
        for check in checkov_infra["kustomize"]["results"]["passed_checks"]
        if "/overlays/" in check["file_path"]
    }
    assert overlays_scanned == set(OVERLAYS)


def test_every_checkov_skip_carries_its_reason_inline(checkov_infra):
    skipped = [check for report in checkov_infra.values() for check in report["results"]["skipped_checks"]]
    assert skipped, "expected the documented skips (digest pinning, env secrets, Dockerfile HEALTHCHECK)"
    for check in skipped:
        reason = check["check_result"].get("suppress_comment", "")
        assert len(reason) > 40, f"{check['check_id']} in {check['file_path']} is skipped without a reason"


def test_checkov_fails_a_privileged_root_container(infra_tools, tmp_path):
    bad = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "bad", "namespace": contract.TRAINING_NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": True}}]},
    }
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    (report,) = _checkov(infra_tools, tmp_path, ["kubernetes"])
    failed = {check["check_id"] for check in report["results"]["failed_checks"]}
    assert {"CKV_K8S_16", "CKV_K8S_14", "CKV_K8S_23"} <= failed  # privileged, unpinned image, root
