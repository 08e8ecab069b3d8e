"""infra/helm/airflow/values.yaml against the decisions it encodes and the names the cluster objects use.

The official chart is not reachable offline, so these tests check the values themselves: executor, external
database, secrets only by reference, baked DAGs, sizing, the restricted profile, and that every name and
address the Airflow pods are given agrees with orchestration/k8s_contract.py, core/settings.py and infra/k8s.
`helm lint` / `helm template` against the pinned chart version is the deploy-time check (infra/README.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from core.settings import SECRET_SETTINGS, ClusterServices, Profile, Settings, setting_env_names
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


# --- the settings every Airflow pod runs with -----------------------------------------------------------
#
# The chart gives each Airflow container (scheduler, DAG processor, triggerer, every task pod) the `env` list
# as plain values, the `secret` list from Secrets, and `extraEnv` as written (here: the downward API). The
# environment below is built the same way, with placeholders for what only the cluster knows; Settings is then
# read from exactly that environment, as the task's process reads it.

# What the Secrets hold in a real cluster: addresses of real services (never this machine), fake passwords.
SECRET_PLACEHOLDERS = {
    ("mlops-postgres-dsn", "dsn"): (
        "postgresql://mlops:placeholder@postgres.db.example.internal:5432/mlops?sslmode=require"
    ),
    (
        "mlops-feast-redis-url",
        "url",
    ): "redis://:placeholder@feast-redis.mlops-serving.svc.cluster.local:6379/0",
    ("mlops-mlflow-client", "username"): "airflow",
    ("mlops-mlflow-client", "password"): "placeholder",
}
# What the downward API hands a pod (`fieldRef`).
DOWNWARD_API = {"status.podIP": "10.42.0.17"}
# Settings a pod may leave unset, each with what "unset" means there. Each of them defaults to None.
UNSET_MEANS = {
    # No Spark Connect server in the cluster: each task starts its own Spark driver on spark_master.
    "MLOPS_SPARK_REMOTE": "a Spark driver in the task's own process",
    # No object storage by default: the lake, the DVC remote and MLflow's artifacts live on the shared
    # filesystem mounted at /mlops (infra/README.md, "Storage").
    "MLOPS_CLUSTER__OBJECT_STORE_URI": "DVC remote on the shared filesystem ($MLOPS_HOME/dvc-remote)",
    "MLOPS_CLUSTER__OBJECT_STORE_REGION": "no object storage, so no region to check",
    "MLOPS_CLUSTER__OBJECT_STORE_ENDPOINT": "no object storage, so no endpoint to check",
}
# Settings whose cluster value differs from the code's default on purpose; every other one in values.yaml
# repeats the default, so a default changed in code and not here fails below instead of drifting apart.
CLUSTER_CHOICES = {
    "MLOPS_PROFILE",
    "MLOPS_HOME",
    "MLOPS_LANDING_DIR",
    "MLOPS_TRAINING__RUNNER",
    "MLOPS_TRAINING__IMAGE",
    "MLOPS_CLUSTER__POSTGRES_DSN",
    "MLOPS_CLUSTER__REDIS_URL",
    "MLOPS_CLUSTER__SPARK_MASTER",
    "MLOPS_CLUSTER__MLFLOW_TRACKING_URI",
    "MLOPS_CLUSTER__SPARK_DRIVER_HOST",
}
# Variables read by libraries rather than by core.settings (each checked to exist in the library).
MLFLOW_VARIABLES = {
    "MLFLOW_ALLOW_PICKLE_DESERIALIZATION",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
}
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def pod_env_sources(values: dict[str, Any]) -> dict[str, str]:
    """Each variable an Airflow pod gets, and from where: `value`, `secret` or `downward`."""
    sources: dict[str, str] = {}
    entries = [(item["name"], "value") for item in values.get("env") or []]
    entries += [(item["envName"], "secret") for item in values.get("secret") or []]
    for item in yaml.safe_load(values.get("extraEnv") or "[]") or []:
        value_from = item.get("valueFrom") or {}
        entries.append((item["name"], "downward" if "fieldRef" in value_from else "value"))
    for name, source in entries:
        assert name not in sources, f"{name} is set twice in values.yaml"
        sources[name] = source
    return sources


def pod_environment(values: dict[str, Any]) -> dict[str, str]:
    """The environment an Airflow pod gets from these values, Secrets and downward API filled in."""
    env: dict[str, str] = {}
    for item in values.get("env") or []:
        # The chart quotes every value; a YAML number or boolean here would be its Python spelling.
        assert isinstance(item["value"], str), f"{item['name']}: write the value as a YAML string"
        env[item["name"]] = item["value"]
    for item in values.get("secret") or []:
        env[item["envName"]] = SECRET_PLACEHOLDERS[(item["secretName"], item["secretKey"])]
    for item in yaml.safe_load(values.get("extraEnv") or "[]") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
        else:
            env[item["name"]] = DOWNWARD_API[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def settings_from(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> Settings:
    """Settings read from exactly `env`: every MLOPS_* variable of this test process is removed first."""
    for name in [name for name in os.environ if name.startswith("MLOPS_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def setting_value(settings: Settings, name: str) -> Any:
    value: Any = settings.model_dump(mode="json")
    for part in name.removeprefix("MLOPS_").lower().split("__"):
        value = value[part]
    return value


def _host(address: str) -> str | None:
    return urlsplit(address).hostname


def test_every_setting_is_given_to_the_airflow_pods_or_listed_as_unset_on_purpose():
    sources = pod_env_sources(VALUES)
    missing = [name for name in setting_env_names() if name not in sources and name not in UNSET_MEANS]
    assert missing == [], "set these in values.yaml `env` (or `secret`), or list them in UNSET_MEANS"
    assert not set(UNSET_MEANS) & set(sources), "a setting in UNSET_MEANS is set after all"
    # An allow-listed setting must really mean "unset" (None) in the code.
    defaults = Settings.model_construct()
    for name in UNSET_MEANS:
        assert name in setting_env_names(), name
        assert setting_value(defaults, name) is None, f"{name} has a default: set it explicitly"


def test_every_variable_in_the_values_is_a_setting_or_a_known_library_variable():
    import mlflow.environment_variables as mlflow_variables

    names = set(pod_env_sources(VALUES))
    unknown = names - set(setting_env_names()) - MLFLOW_VARIABLES
    assert unknown == set(), "misspelt? not a core.settings setting nor a known library variable"
    for name in MLFLOW_VARIABLES:
        assert getattr(mlflow_variables, name).name == name


def test_credentials_reach_the_pods_only_from_secrets():
    sources = pod_env_sources(VALUES)
    for name in SECRET_SETTINGS | {"MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}:
        assert sources.get(name) == "secret", f"{name} must come from the `secret` list, not a plain value"
    (postgres,) = [item for item in VALUES["secret"] if item["envName"] == "MLOPS_CLUSTER__POSTGRES_DSN"]
    assert (postgres["secretName"], postgres["secretKey"]) == ("mlops-postgres-dsn", "dsn")


def test_the_pods_settings_point_at_cluster_services_and_the_shared_filesystem(monkeypatch):
    settings = settings_from(monkeypatch, pod_environment(VALUES))
    assert settings.profile is Profile.CLUSTER
    assert settings.home == Path(contract.DATA_MOUNT)
    assert settings.landing.is_relative_to(contract.DATA_MOUNT)
    for path in (settings.home, settings.landing):
        assert not path.is_relative_to(REPO), f"{path} is inside the repository, not on the shared volume"
    addresses = {
        "postgres_dsn": settings.cluster.postgres_dsn,
        "redis_url": settings.cluster.redis_url,
        "mlflow_tracking_uri": settings.mlflow_tracking_uri,
        "promotion_ledger_url": settings.promotion_ledger_url,
    }
    for what, address in addresses.items():
        assert _host(address) not in LOOPBACK_HOSTS | {None}, f"{what}={address}"
    assert settings.cluster.spark_driver_host not in LOOPBACK_HOSTS
    # Spark in the task pod itself (local[N]), or a cluster master that is not this pod.
    master = settings.spark_master
    assert re.fullmatch(r"local\[\d+\]", master) or _host(master) not in LOOPBACK_HOSTS | {None}, master
    assert settings.training_runner == "kubernetes"
    assert settings.online_store == "redis"
    assert settings.promotion_ledger_url.startswith("postgresql+psycopg2://")


def test_the_values_repeat_the_codes_defaults_except_where_the_cluster_differs(monkeypatch):
    cluster = settings_from(monkeypatch, pod_environment(VALUES))
    defaults = settings_from(monkeypatch, {})
    differs = {
        name
        for name in pod_env_sources(VALUES)
        if name in setting_env_names() and setting_value(cluster, name) != setting_value(defaults, name)
    }
    assert differs - CLUSTER_CHOICES == set(), "a value differs from the code's default: list it or align it"


def test_the_settings_test_fails_on_values_that_leave_a_setting_out_or_point_home(monkeypatch):
    """The checks above, against two broken variants of the values."""
    missing = {**VALUES, "env": [item for item in VALUES["env"] if item["name"] != "MLOPS_GATE__MARGIN"]}
    assert "MLOPS_GATE__MARGIN" not in pod_env_sources(missing)
    loopback = {
        **VALUES,
        "env": [
            {**item, "value": "spark://127.0.0.1:7077"}
            if item["name"] == "MLOPS_CLUSTER__SPARK_MASTER"
            else item
            for item in VALUES["env"]
        ],
    }
    assert _host(settings_from(monkeypatch, pod_environment(loopback)).spark_master) == "127.0.0.1"


def test_every_airflow_container_mounts_the_shared_filesystem_read_write_at_the_data_mount():
    claims = {
        volume["name"]: volume["persistentVolumeClaim"]["claimName"]
        for volume in VALUES.get("volumes") or []
        if "persistentVolumeClaim" in volume
    }
    (volume,) = [name for name, claim in claims.items() if claim == contract.DATA_CLAIM]
    (mount,) = [item for item in VALUES.get("volumeMounts") or [] if item["name"] == volume]
    assert mount["mountPath"] == contract.DATA_MOUNT
    assert not mount.get("readOnly") and not mount.get("subPath")
    assert env_value("MLOPS_HOME") == contract.DATA_MOUNT
