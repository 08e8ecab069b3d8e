"""infra/helm/airflow/values.yaml against the decisions it encodes and the names the cluster objects use.

The official chart is not reachable offline, so these tests check the values themselves: executor, external
database, secrets only by reference, baked DAGs, sizing, the restricted profile, and that every name and
address the Airflow pods are given agrees with orchestration/k8s_contract.py, core/settings.py and infra/k8s.
`helm lint` / `helm template` against the pinned chart version is the deploy-time check (infra/README.md).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from core.settings import ClusterServices
from orchestration import k8s_contract as contract

REPO = Path(__file__).resolve().parents[2]
VALUES = yaml.safe_load((REPO / "infra" / "helm" / "airflow" / "values.yaml").read_text())
BASE = REPO / "infra" / "k8s" / "base"
LOCK = dict(
    line.split("==", 1) for line in (REPO / "requirements.lock").read_text().splitlines() if "==" in line
)
# Keys whose value would be a credential written into the values file.
_INLINE_SECRET = re.compile(r"(password|pass|fernetKey|secretKey|jwtSecret|token)$", re.IGNORECASE)


def env_value(name: str) -> str:
    (value,) = [item["value"] for item in VALUES["env"] if item["name"] == name]
    return value


def inline_secrets(node: Any, path: str = "") -> list[str]:
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}" if path else key
            # In a {secretName, secretKey} reference, secretKey names a key of the Secret, not a credential.
            is_reference = key == "secretKey" and "secretName" in node
            if _INLINE_SECRET.search(key) and value not in (None, "", {}) and not is_reference:
                found.append(where)
            found += inline_secrets(value, where)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            found += inline_secrets(item, f"{path}[{index}]")
    return found


def test_the_executor_runs_each_task_in_its_own_pod():
    assert VALUES["executor"] == "KubernetesExecutor"


def test_the_metadata_database_is_an_external_postgresql_reached_through_a_secret():
    assert VALUES["postgresql"]["enabled"] is False
    assert VALUES["data"]["metadataSecretName"]
    assert "metadataConnection" not in VALUES["data"]


def test_every_credential_is_a_secret_reference():
    assert inline_secrets(VALUES) == []
    for key in ("fernetKeySecretName", "apiSecretKeySecretName", "jwtSecretName"):
        assert VALUES[key], key
    for entry in VALUES["secret"]:
        assert set(entry) == {"envName", "secretName", "secretKey"}, entry


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"fernetKey": "x9Zk..."}, ["fernetKey"]),
        (
            {"data": {"metadataConnection": {"user": "airflow", "pass": "airflow"}}},
            ["data.metadataConnection.pass"],
        ),
        ({"env": [{"name": "X", "password": "hunter2"}]}, ["env[0].password"]),
        ({"fernetKeySecretName": "airflow-fernet-key", "fernetKey": None}, []),
        ({"secret": [{"envName": "A", "secretName": "s", "secretKey": "password"}]}, []),
        ({"apiServer": {"secretKey": "inline"}}, ["apiServer.secretKey"]),
    ],
)
def test_the_inline_secret_scan_finds_credentials_anywhere(values, expected):
    assert inline_secrets(values) == expected


def test_dags_are_baked_into_the_project_image_of_the_locked_airflow_version():
    assert VALUES["dags"]["gitSync"]["enabled"] is False
    assert VALUES["dags"]["persistence"]["enabled"] is False
    image = VALUES["images"]["airflow"]
    assert image["repository"].endswith(f"/{contract.AIRFLOW_IMAGE_REPOSITORY}")
    assert VALUES["defaultAirflowRepository"] == image["repository"]
    assert image["tag"] and image["tag"] != "latest"
    assert VALUES["airflowVersion"] == LOCK["apache-airflow"]


@pytest.mark.parametrize(
    "component", ["scheduler", "apiServer", "dagProcessor", "triggerer", "workers", "migrateDatabaseJob"]
)
def test_every_component_requests_and_limits_cpu_and_memory(component):
    resources = VALUES[component]["resources"]
    for resource in ("cpu", "memory"):
        request = contract.parse_quantity(resources["requests"][resource])
        limit = contract.parse_quantity(resources["limits"][resource])
        assert 0 < request <= limit, f"{component} {resource}"


def test_airflow_pods_pass_the_restricted_profile_the_namespace_enforces():
    contexts = VALUES["securityContexts"]
    pod = {
        "securityContext": contexts["pod"],
        "containers": [{"name": "c", "securityContext": contexts["containers"]}],
    }
    assert contract.restricted_profile_violations(pod) == []


def test_the_worker_service_account_is_the_one_bound_in_the_training_namespace():
    assert VALUES["workers"]["serviceAccount"]["name"] == contract.AIRFLOW_WORKER_SERVICE_ACCOUNT
    binding = next(
        doc
        for doc in yaml.safe_load_all((BASE / "training" / "launcher-rbac.yaml").read_text())
        if doc["kind"] == "RoleBinding"
    )
    assert {
        "kind": "ServiceAccount",
        "name": VALUES["workers"]["serviceAccount"]["name"],
        "namespace": contract.ORCHESTRATION_NAMESPACE,
    } in binding["subjects"]


def test_airflow_pods_launch_training_in_the_contract_namespace_with_the_contract_image():
    namespace = env_value("MLOPS_CLUSTER__KUBERNETES_NAMESPACE")
    assert namespace == contract.TRAINING_NAMESPACE == ClusterServices().kubernetes_namespace
    repository, _, tag = env_value("MLOPS_TRAINING__IMAGE").rpartition(":")
    assert repository.endswith(f"/{contract.TRAINING_IMAGE_REPOSITORY}")
    assert tag and tag != "latest"
    assert env_value("MLOPS_PROFILE") == "cluster"


def test_the_mlflow_address_is_the_tracking_servers_service():
    service = yaml.safe_load((BASE / "mlflow" / "service.yaml").read_text())
    address = urlsplit(env_value("MLOPS_CLUSTER__MLFLOW_TRACKING_URI"))
    expected_host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
    assert (address.hostname, address.port) == (expected_host, service["spec"]["ports"][0]["port"])
    assert service["metadata"]["namespace"] == contract.ORCHESTRATION_NAMESPACE
