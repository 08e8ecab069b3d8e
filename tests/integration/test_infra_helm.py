"""infra/helm: the Airflow values against the decisions they encode and the names the cluster objects use, and
the scoring service's chart against the kustomize objects it repeats.

The official Airflow chart is not reachable offline, so these tests check the values themselves: executor,
external database, secrets only by reference, baked DAGs, sizing, the restricted profile, and that every name
and address the Airflow pods are given agrees with orchestration/k8s_contract.py, core/settings.py and
infra/k8s. The scoring chart (infra/helm/fraud-scoring) is rendered by conftest.render_chart, which knows the
template language the chart uses and nothing more. The settings of every pod that runs the project's code
(Airflow's, the scoring service's from kustomize and from the chart) are read from exactly the environment
those files give it. `helm lint` / `helm template` are the deploy-time check (infra/README.md).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from core.settings import SECRET_SETTINGS, ClusterServices, Profile, Settings, setting_env_names
from orchestration import k8s_contract as contract
from tests.integration.conftest import (
    CHART_DIR,
    DATA_SUBPATH_MOUNTS,
    OVERLAYS,
    SCORING_LOG_SUBPATH,
    TemplateError,
    data_claim_mount_problems,
    one,
    render_chart,
    render_helm_template,
    schema_errors,
)

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


def test_the_product_dags_are_active_once_deployed_and_the_synthetic_feed_is_not():
    """Airflow creates every DAG paused by default, so a fresh cluster ran nothing until someone unpaused
    each; the chart makes them active at creation, except the synthetic feed, which pins itself paused."""
    from airflow.dag_processing.dagbag import DagBag

    assert VALUES["config"]["core"]["dags_are_paused_at_creation"] == "False"
    dags = DagBag(dag_folder=str(REPO / "dags")).dags
    pinned = {dag_id for dag_id, dag in dags.items() if dag.is_paused_upon_creation is not None}
    assert pinned == {"synthetic_landing"} and dags["synthetic_landing"].is_paused_upon_creation is True


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


def test_the_triggerer_service_account_is_the_one_bound_to_the_watcher_role():
    """The pod tasks defer: the triggerer reads their pods in the training namespace under its own name."""
    assert VALUES["triggerer"]["serviceAccount"] == {
        "create": True,
        "name": contract.AIRFLOW_TRIGGERER_SERVICE_ACCOUNT,
    }
    bindings = {
        doc["metadata"]["name"]: doc
        for doc in yaml.safe_load_all((BASE / "training" / "launcher-rbac.yaml").read_text())
        if doc["kind"] == "RoleBinding"
    }
    assert bindings[contract.TRAINING_WATCHER_ROLE]["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": contract.AIRFLOW_TRIGGERER_SERVICE_ACCOUNT,
            "namespace": contract.ORCHESTRATION_NAMESPACE,
        }
    ]


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


CHECKS_DIR = REPO / "infra" / "helm" / "mlops-checks"
# The Airflow chart's own Secret for its metadata database, which the doctor reads the DAGs' state from.
METADATA_CONNECTION = "postgresql://airflow:placeholder@postgres.db.example.internal:5432/airflow"


def _doctor_pod() -> dict[str, Any]:
    """`helm template mlops-checks infra/helm/mlops-checks -f infra/helm/airflow/values.yaml`: its object."""
    (pod,) = render_chart(CHECKS_DIR, VALUES, contract.ORCHESTRATION_NAMESPACE, "mlops-checks")
    return pod


def _doctor_environment(container: dict[str, Any]) -> dict[str, str]:
    secrets = {
        **SECRET_PLACEHOLDERS,
        (VALUES["data"]["metadataSecretName"], "connection"): METADATA_CONNECTION,
    }
    env = {}
    for item in container["env"]:
        assert item["name"] not in env, f"{item['name']} is set twice"
        if "value" in item:
            env[item["name"]] = item["value"]
        elif ref := item["valueFrom"].get("secretKeyRef"):
            env[item["name"]] = secrets[(ref["name"], ref["key"])]
        else:
            env[item["name"]] = DOWNWARD_API[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def test_the_post_install_check_is_the_doctor_with_the_airflow_pods_settings_volumes_and_labels(
    monkeypatch, infra_tools
):
    """#57 item 1: `helm test` runs `mlops doctor` in a pod made from the Airflow release's values, so it
    checks with what every task has: the same environment (plus Airflow's own metadata connection, where the
    DAGs' paused state is), Secrets, shared filesystem and pseudonym key, identity and NetworkPolicies."""
    pod = _doctor_pod()
    assert pod["kind"] == "Pod" and pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["metadata"]["namespace"] == contract.ORCHESTRATION_NAMESPACE
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["mlops", "doctor", "--json"]  # exit 1 on a failed check fails `helm test`
    assert container["image"] == "{repository}:{tag}".format(**VALUES["images"]["airflow"])

    env = _doctor_environment(container)
    assert env.pop("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN") == METADATA_CONNECTION
    assert env.pop("HOME") == "/tmp"
    assert env == pod_environment(VALUES)
    settings = settings_from(monkeypatch, env)
    assert settings.profile is Profile.CLUSTER and settings.spark_remote
    # its identity and labels are the task pods': the worker's Role, the Airflow pods' egress policies
    assert pod["spec"]["serviceAccountName"] == contract.AIRFLOW_WORKER_SERVICE_ACCOUNT
    assert {"tier": "airflow", "component": "worker", "release": "airflow"}.items() <= pod["metadata"][
        "labels"
    ].items()
    assert pod["spec"]["volumes"][: len(VALUES["volumes"])] == VALUES["volumes"]
    assert container["volumeMounts"][: len(VALUES["volumeMounts"])] == VALUES["volumeMounts"]
    assert data_claim_mount_problems(contract.ORCHESTRATION_NAMESPACE, pod["spec"]) == []
    assert contract.restricted_profile_violations(pod["spec"]) == []
    assert schema_errors(infra_tools, [pod]) == []


# The Spark settings the Connect server reads itself (its driver's JVM), which must be the Airflow pods' too:
# `mlops` run in either place derives the same driver options from them.
SPARK_DRIVER_SETTINGS = ("MLOPS_SPARK_DRIVER_MEMORY", "MLOPS_SPARK_JAVA_OPTIONS")


def _spark_container(objects: list[dict[str, Any]], name: str) -> dict[str, Any]:
    deployment = one(objects, "Deployment", name, contract.ORCHESTRATION_NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def _service_address(objects: list[dict[str, Any]], name: str, port_name: str) -> tuple[str, int, str]:
    """(host, port, target port's name) of a Service of the orchestration namespace."""
    service = one(objects, "Service", name, contract.ORCHESTRATION_NAMESPACE)
    (port,) = [p for p in service["spec"]["ports"] if p["name"] == port_name]
    host = f"{name}.{contract.ORCHESTRATION_NAMESPACE}.svc.cluster.local"
    return host, port["port"], port["targetPort"]


def _container_port(container: dict[str, Any], name: str) -> int:
    (port,) = [p["containerPort"] for p in container["ports"] if p["name"] == name]
    return port


def _flag(container: dict[str, Any], flag: str) -> str:
    args = container.get("args", [])
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_airflow_pods_spark_is_the_spark_cluster_the_manifests_deploy(rendered, overlay, monkeypatch):
    """Item 3 of #57: what Airflow's tasks are given (values.yaml) is the Spark infra/k8s/base/spark runs: its
    Connect server's Service and port, its Master's; the Connect server's driver settings are the pods'; all
    of it the Airflow image of the values. tests/e2e/test_cluster_profile.py runs these same containers."""
    objects = rendered[overlay]
    tasks = settings_from(monkeypatch, pod_environment(VALUES))
    connect = _spark_container(objects, "spark-connect")
    server = settings_from(monkeypatch, container_environment(connect))

    # The tasks are clients of the Connect server: its Service, whose port reaches the one it listens on.
    host, port, target = _service_address(objects, "spark-connect", "grpc")
    remote = urlsplit(tasks.spark_remote or "")
    assert (remote.scheme, remote.hostname, remote.port) == ("sc", host, port)
    assert connect["command"] == ["mlops", "spark-connect"]
    assert _container_port(connect, target) == int(_flag(connect, "--port"))
    assert _flag(connect, "--host") == "0.0.0.0"  # the pod's every address: the Service's traffic reaches it

    # One Master for all: the Service's address is where the Connect server and every Worker go.
    host, port, target = _service_address(objects, "spark-master", "spark")
    master = f"spark://{host}:{port}"
    assert server.spark_master == tasks.spark_master == master
    master_container = _spark_container(objects, "spark-master")
    assert _container_port(master_container, target) == int(_flag(master_container, "--port"))
    worker = _spark_container(objects, "spark-worker")
    assert worker["args"][-1] == master
    # Executors reach the driver at the Connect pod's own address, not a loopback.
    assert server.cluster.spark_driver_host == DOWNWARD_API["status.podIP"]
    for name in SPARK_DRIVER_SETTINGS:
        assert setting_value(server, name) == setting_value(tasks, name), name
    # The executors fit the Workers: spark.executor.memory within a Worker's --memory.
    executor = _flag(connect, "--conf").removeprefix("spark.executor.memory=")
    assert _gib(executor) <= _gib(_flag(worker, "--memory")), (executor, _flag(worker, "--memory"))

    image = "{repository}:{tag}".format(**VALUES["images"]["airflow"])
    for name in ("spark-master", "spark-worker", "spark-connect"):
        assert _spark_container(objects, name)["image"] == image, name


def _gib(size: str) -> float:
    number, unit = re.fullmatch(r"(\d+)([gm])", size).groups()  # type: ignore[union-attr]
    return int(number) / (1024 if unit == "m" else 1)


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
    # No object storage by default: the lake, the DVC remote and MLflow's artifacts live on the shared
    # filesystem mounted at /mlops (infra/README.md, "Storage").
    "MLOPS_CLUSTER__OBJECT_STORE_URI": "DVC remote on the shared filesystem ($MLOPS_HOME/dvc-remote)",
    "MLOPS_CLUSTER__OBJECT_STORE_REGION": "no object storage, so no region to check",
    "MLOPS_CLUSTER__OBJECT_STORE_ENDPOINT": "no object storage, so no endpoint to check",
    # The scoring service's live entity state takes over from the lake's history when it starts; a time is
    # set only to replay a past day through it.
    "MLOPS_SERVING__LIVE_FROM": "the scoring service's start time",
    # Alerts go nowhere until an operator names a receiver: they are only logged (core/alerts.py).
    "MLOPS_ALERTS__WEBHOOK_URL": "no webhook: alerts are logged, not posted",
    "MLOPS_ALERTS__SMTP_HOST": "no mail server: alerts are not mailed (email_to needs one)",
    # A relay's login and CA, a webhook's credential: the operator's, from a Secret (infra/README.md).
    "MLOPS_ALERTS__SMTP_USERNAME": "no login: the mail server takes alerts without one",
    "MLOPS_ALERTS__SMTP_PASSWORD": "no login (a Secret's key where there is one: the `secret` list)",
    "MLOPS_ALERTS__SMTP_CA_FILE": "the system's CAs check the mail server's certificate",
    "MLOPS_ALERTS__WEBHOOK_AUTHORIZATION": "no Authorization header on the webhook's POST",
    # The cluster's tracking URI is its MLflow server's: approvers follow links to it.
    "MLOPS_MLFLOW_UI_URL": "the tracking URI (the cluster's MLflow server)",
    # Airflow runs in the cluster it launches pods in: the pods' service account, no connection.
    "MLOPS_CLUSTER__KUBERNETES_CONN_ID": "in-cluster config (the service account of the worker or triggerer)",
    # Lineage events go to files on the shared filesystem ($MLOPS_HOME/lineage) until an operator names an
    # OpenLineage consumer (Marquez: docs/lineage.md).
    "MLOPS_LINEAGE__URL": "no consumer: events are written to files only",
    # HTTPS once an operator mounts a kubernetes.io/tls Secret and names its files (docs/serving.md, "TLS").
    "MLOPS_SERVING__TLS_CERT_FILE": "plain HTTP inside the cluster until a certificate is mounted",
    "MLOPS_SERVING__TLS_KEY_FILE": "plain HTTP inside the cluster until a certificate is mounted",
    # The label maturity is the constant until an operator has the wait follow the feed (0.95).
    "MLOPS_TRAINING__LABEL_MATURITY_QUANTILE": "training.label_maturity_days, the constant",
    # Only the scoring pod reads the promotion history with a login of its own (read-only).
    "MLOPS_SERVING__LEDGER_URL": "the promotion history itself (MLOPS_CLUSTER__POSTGRES_DSN)",
}
# Settings whose cluster value differs from the code's default on purpose; every other one in values.yaml
# repeats the default, so a default changed in code and not here fails below instead of drifting apart.
CLUSTER_CHOICES = {
    "MLOPS_PROFILE",
    "MLOPS_PRIVACY__KEY_FILE",
    "MLOPS_HOME",
    "MLOPS_LANDING_DIR",
    "MLOPS_TRAINING__RUNNER",
    "MLOPS_TRAINING__IMAGE",
    "MLOPS_CLUSTER__POSTGRES_DSN",
    "MLOPS_CLUSTER__REDIS_URL",
    "MLOPS_CLUSTER__SPARK_MASTER",
    # Every task's Spark work goes to the cluster's Spark Connect server (infra/k8s/base/spark).
    "MLOPS_SPARK_REMOTE",
    "MLOPS_CLUSTER__MLFLOW_TRACKING_URI",
    "MLOPS_CLUSTER__SPARK_DRIVER_HOST",
    # The scoring service's callers: the Secret's mount, and the Service's names as Host.
    "MLOPS_SERVING__TOKENS_FILE",
    "MLOPS_SERVING__ALLOWED_HOSTS",
    # Two scoring replicas or more: they share one ordered log of observations (serving/replication.py).
    "MLOPS_SERVING__REPLICATED",
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
    # Spark on the cluster's master and Connect server, neither of them this pod.
    assert _host(settings.spark_master) not in LOOPBACK_HOSTS | {None}, settings.spark_master
    assert settings.spark_remote and _host(settings.spark_remote) not in LOOPBACK_HOSTS, settings.spark_remote
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


# --- the scoring service: kustomize's Deployment and the chart, settings and objects ------------------------
#
# The scoring pod gets every setting as a plain `env` value, its credentials from Secrets of the serving
# namespace and its address from the downward API (infra/k8s/base/serving/fraud-scoring.yaml); the chart
# renders the same container. Its environment is rebuilt here the same way as the Airflow pods', and the
# settings read from it.

SCORING_SECRET_PLACEHOLDERS = {
    ("mlops-feast-redis-url", "url"): SECRET_PLACEHOLDERS[("mlops-feast-redis-url", "url")],
    ("mlops-mlflow-client", "username"): "scoring",
    ("mlops-mlflow-client", "password"): "placeholder",
    ("fraud-scoring-ledger", "url"): (
        "postgresql://ledger_reader:placeholder@postgres.db.example.internal:5432/mlops?sslmode=require"
    ),
}
# What the scoring pod leaves unset besides UNSET_MEANS, and why.
SCORING_UNSET = {
    **{name: why for name, why in UNSET_MEANS.items() if name != "MLOPS_SERVING__LEDGER_URL"},
    # The service writes no promotion history: no login that can. The code's default (a local address) is
    # never used there; it reads the history with its own read-only login (MLOPS_SERVING__LEDGER_URL).
    "MLOPS_CLUSTER__POSTGRES_DSN": "no write access: the scoring service reads the history read-only",
    "MLOPS_SPARK_REMOTE": "no Spark in the scoring image: the service reads the lake with Arrow",
}
# Settings that differ between the scoring pod and the Airflow pods on purpose; all others must agree, so a
# value changed for one (a threshold, a window) and not the other fails here.
PER_POD = {
    "MLOPS_SERVING__HOST": "the scoring service listens on the pod's address; Airflow runs no service",
    "MLOPS_CLUSTER__SPARK_MASTER": "Airflow's tasks use the Spark cluster; no Spark in the scoring image",
    "MLOPS_SPARK_REMOTE": "Airflow's tasks use the Spark cluster; no Spark in the scoring image",
    "MLOPS_CLUSTER__POSTGRES_DSN": "only Airflow's pods write the promotion history",
    "MLOPS_SERVING__LEDGER_URL": "the scoring pod reads the promotion history with a read-only login",
}


def _scoring_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(objects, "Deployment", "fraud-scoring", contract.SERVING_NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def container_env_sources(container: dict[str, Any]) -> dict[str, str]:
    """Each variable the container gets, and from where: `value`, `secret` or `downward`."""
    assert not container.get("envFrom"), "settings are plain values, so a change replaces the pod"
    sources: dict[str, str] = {}
    for item in container["env"]:
        assert item["name"] not in sources, f"{item['name']} is set twice"
        value_from = item.get("valueFrom") or {}
        sources[item["name"]] = (
            "value" if "value" in item else "secret" if "secretKeyRef" in value_from else "downward"
        )
    return sources


def container_environment(container: dict[str, Any]) -> dict[str, str]:
    env = {}
    for item in container["env"]:
        if "value" in item:
            assert isinstance(item["value"], str), f"{item['name']}: a Kubernetes env value is a string"
            env[item["name"]] = item["value"]
        elif ref := item["valueFrom"].get("secretKeyRef"):
            env[item["name"]] = SCORING_SECRET_PLACEHOLDERS[(ref["name"], ref["key"])]
        else:
            env[item["name"]] = DOWNWARD_API[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


@pytest.fixture(scope="module", params=[*(f"kustomize {o}" for o in OVERLAYS), "helm chart"])
def scoring_objects(request, rendered) -> list[dict[str, Any]]:
    """The scoring service's objects as each overlay renders them, and as the chart does with its values."""
    if request.param == "helm chart":
        return render_chart()
    return rendered[request.param.removeprefix("kustomize ")]


def test_every_setting_is_given_to_the_scoring_pod_or_listed_as_unset_on_purpose(scoring_objects):
    sources = container_env_sources(_scoring_container(scoring_objects))
    missing = [name for name in setting_env_names() if name not in sources and name not in SCORING_UNSET]
    assert missing == [], "set these in the scoring Deployment's env (and the chart), or list them above"
    assert not set(SCORING_UNSET) & set(sources), "a setting listed as unset is set after all"
    unknown = set(sources) - set(setting_env_names()) - MLFLOW_VARIABLES
    assert unknown == set(), "misspelt? not a core.settings setting nor a known library variable"
    defaults = Settings.model_construct()
    for name in set(SCORING_UNSET) - {"MLOPS_CLUSTER__POSTGRES_DSN"}:
        assert setting_value(defaults, name) is None, f"{name} has a default: set it explicitly"


def test_the_scoring_pods_credentials_come_only_from_secrets(scoring_objects):
    sources = container_env_sources(_scoring_container(scoring_objects))
    for name in {
        "MLOPS_CLUSTER__REDIS_URL",
        "MLOPS_SERVING__LEDGER_URL",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    }:
        assert sources.get(name) == "secret", name
    assert "MLOPS_CLUSTER__POSTGRES_DSN" not in sources


def test_the_scoring_pods_settings_point_at_cluster_services_and_its_own_port(scoring_objects, monkeypatch):
    container = _scoring_container(scoring_objects)
    settings = settings_from(monkeypatch, container_environment(container))
    assert settings.profile is Profile.CLUSTER
    assert settings.home == Path(contract.DATA_MOUNT)
    assert settings.online_store == "redis"
    for what, address in {
        "redis_url": settings.cluster.redis_url,
        "mlflow_tracking_uri": settings.mlflow_tracking_uri,
        "serving_ledger_url": settings.serving_ledger_url,
    }.items():
        assert _host(address) not in LOOPBACK_HOSTS | {None}, f"{what}={address}"
    assert settings.cluster.spark_driver_host not in LOOPBACK_HOSTS
    assert re.fullmatch(r"local\[\d+\]", settings.spark_master), settings.spark_master
    # It listens where the probes, the Service and the command say.
    (port,) = container["ports"]
    assert settings.serving.port == port["containerPort"]
    assert container["command"] == [
        "mlops",
        "serve",
        "--host",
        settings.serving.host,
        "--port",
        str(port["containerPort"]),
    ]
    assert settings.serving.host == "0.0.0.0"
    # The scoring log goes where the writable mount is.
    assert str(settings.scoring_log_dir) == DATA_SUBPATH_MOUNTS[SCORING_LOG_SUBPATH]
    assert settings.serving.scoring_log is True


def test_the_scoring_pod_and_the_airflow_pods_read_the_same_settings(scoring_objects, monkeypatch):
    scoring = settings_from(monkeypatch, container_environment(_scoring_container(scoring_objects)))
    airflow = settings_from(monkeypatch, pod_environment(VALUES))
    differ = {
        name for name in setting_env_names() if setting_value(scoring, name) != setting_value(airflow, name)
    }
    assert differ - set(PER_POD) == set(), "the scoring pod and the Airflow pods disagree"
    assert set(PER_POD) - {"MLOPS_CLUSTER__POSTGRES_DSN"} <= differ, "no longer differs: drop it from PER_POD"


def test_the_comparison_catches_a_threshold_changed_on_one_side_only(monkeypatch):
    changed = render_chart(overrides={"threshold": "0.7"})
    scoring = settings_from(monkeypatch, container_environment(_scoring_container(changed)))
    airflow = settings_from(monkeypatch, pod_environment(VALUES))
    assert (scoring.serving.threshold, airflow.serving.threshold) == (0.7, 0.5)


# --- the chart ---------------------------------------------------------------------------------------------

CHART_VALUES = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
KUSTOMIZE_SCORING = [
    *yaml.safe_load_all((BASE / "serving" / "fraud-scoring.yaml").read_text()),
    one(
        list(yaml.safe_load_all((BASE / "network-policies" / "serving.yaml").read_text())),
        "NetworkPolicy",
        "fraud-scoring",
    ),
]


def _comparable(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without its metadata labels (the chart adds Helm's), its container env as a map (the chart
    sorts the settings by name)."""
    obj = json.loads(json.dumps(obj))
    obj["metadata"].pop("labels", None)
    if obj["kind"] == "Deployment":
        for container in obj["spec"]["template"]["spec"]["containers"]:
            container["env"] = {item["name"]: item for item in container["env"]}
    return obj


def test_the_chart_renders_the_kustomize_objects_with_its_default_values():
    chart = {(obj["kind"], obj["metadata"]["name"]): obj for obj in render_chart()}
    base = {(obj["kind"], obj["metadata"]["name"]): obj for obj in KUSTOMIZE_SCORING}
    assert set(chart) == set(base)
    for key, obj in chart.items():
        assert _comparable(obj) == _comparable(base[key]), key
        labels = obj["metadata"]["labels"]
        assert set(base[key]["metadata"].get("labels", {}).items()) <= set(labels.items())
        assert (
            labels[contract.APP_LABEL] == "fraud-scoring" and labels["app.kubernetes.io/managed-by"] == "Helm"
        )


def test_the_chart_objects_validate_and_pass_the_restricted_profile_and_the_storage_design(infra_tools):
    objects = render_chart()
    assert schema_errors(infra_tools, objects) == []
    deployment = one(objects, "Deployment", "fraud-scoring", contract.SERVING_NAMESPACE)
    spec = deployment["spec"]["template"]["spec"]
    assert contract.restricted_profile_violations(spec) == []
    assert data_claim_mount_problems(contract.SERVING_NAMESPACE, spec) == []


def test_the_chart_values_set_the_image_the_threshold_and_the_batching(monkeypatch):
    objects = render_chart(
        overrides={
            "image": {"repository": "registry.internal/fraud/mlops-fraud-scoring", "tag": "1.4.2"},
            "threshold": "0.35",
            "batching": {"maxBatchSize": "256", "maxWaitMs": "2.5"},
            "settings": {"MLOPS_SERVING__SHADOW": "false"},
        },
        namespace="scoring-canary",
    )
    container = _scoring_container(
        [{**o, "metadata": {**o["metadata"], "namespace": contract.SERVING_NAMESPACE}} for o in objects]
    )
    assert container["image"] == "registry.internal/fraud/mlops-fraud-scoring:1.4.2"
    assert {o["metadata"]["namespace"] for o in objects} == {"scoring-canary"}
    settings = settings_from(monkeypatch, container_environment(container))
    assert settings.serving.threshold == 0.35
    assert (settings.serving.max_batch_size, settings.serving.max_wait_ms) == (256, 2.5)
    assert settings.serving.shadow is False


def test_tls_from_a_secret_serves_https_probes_and_scrapes_it_and_validates(infra_tools, monkeypatch):
    """`--set tls.secretName=...`: the certificate and key of a kubernetes.io/tls Secret, mounted read-only,
    become the service's TLS settings (serving on HTTPS, tested with a real TLS client in
    test_scoring_service.py); the probes and Prometheus's scrape switch to HTTPS. Default: none of it."""
    objects = render_chart(overrides={"tls": {"secretName": "fraud-scoring-tls"}})
    assert schema_errors(infra_tools, objects) == []
    deployment = one(objects, "Deployment", "fraud-scoring", contract.SERVING_NAMESPACE)
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    assert contract.restricted_profile_violations(spec) == []
    container = _scoring_container(objects)
    settings = settings_from(monkeypatch, container_environment(container))
    (volume,) = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == "fraud-scoring-tls"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    files = {item["key"]: f"{mount['mountPath']}/{item['path']}" for item in volume["secret"]["items"]}
    assert str(settings.serving.tls_cert_file) == files["tls.crt"]
    assert str(settings.serving.tls_key_file) == files["tls.key"]
    probes = [container[p]["httpGet"] for p in ("startupProbe", "readinessProbe", "livenessProbe")]
    assert all(probe.get("scheme") == "HTTPS" for probe in probes)
    assert pod["metadata"]["annotations"]["prometheus.io/scheme"] == "https"
    plain = _scoring_container(render_chart())
    assert not any(p["httpGet"].get("scheme") for p in (plain["startupProbe"], plain["readinessProbe"]))
    assert not {"MLOPS_SERVING__TLS_CERT_FILE", "MLOPS_SERVING__TLS_KEY_FILE"} & set(
        container_environment(plain)
    )


def test_the_chart_values_hold_no_credential_and_give_settings_as_strings():
    assert inline_secrets(CHART_VALUES) == []
    image = CHART_VALUES["image"]
    assert image["repository"].endswith("/mlops-fraud-scoring") and image["tag"] not in ("", "latest")
    given = [
        CHART_VALUES["threshold"],
        *CHART_VALUES["batching"].values(),
        *CHART_VALUES["settings"].values(),
    ]
    assert all(isinstance(value, str) for value in given), "Helm prints a number of a values file as a float"
    assert not set(CHART_VALUES["settings"]) & {
        "MLOPS_SERVING__THRESHOLD",
        "MLOPS_SERVING__MAX_BATCH_SIZE",
        "MLOPS_SERVING__MAX_WAIT_MS",
    }, "these are the values threshold and batching, set once"
    meta = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert meta["apiVersion"] == "v2" and meta["name"] == "fraud-scoring"
    assert meta["appVersion"] == image["tag"]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("a:\n  {{- toYaml .Values.m | nindent 2 }}\nb: 1", "a:\n  x: 1\n  y: '2'\nb: 1"),
        ("{{ .Values.s | quote }}", '"say \\"hi\\""'),
        ("l:\n  {{- range $k, $v := .Values.m }}\n  - {{ $k }}\n  {{- end }}\nend", "l:\n  - x\n  - y\nend"),
        ("{{ .Release.Namespace }}-{{ .Chart.Name }}", "ns-chart"),
        ("a{{ if .Values.s }}+{{ .Values.s }}{{ end }}b", 'a+say "hi"b'),
        ("a{{ if .Values.e }}+{{ else }}-{{ end }}b", "a-b"),
        ("x:\n  {{- if .Values.m }}\n  y: 1\n  {{- end }}", "x:\n  y: 1"),
    ],
)
def test_the_renderer_follows_helms_trim_markers_ranges_and_functions(template, expected):
    values = {"m": {"y": "2", "x": 1}, "s": 'say "hi"', "e": ""}
    rendered = render_helm_template(template, values, {"Namespace": "ns"}, {"Name": "chart"})
    assert rendered == expected


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{{ .Values.missing }}", "no such value"),
        ("{{ .Values.n | quote }}", "write it as a string"),
        ("{{ .Values.n }}", "write it as a string"),
        ('{{ include "name" . }}', "unsupported command"),
        ("{{ .Values.s | upper }}", "unsupported command"),
        ("{{ range $k, $v := .Values.m }}x", "without `end`"),
        ("{{-.Values.s}}", "unsupported term"),
        ("{{ if .Values.s }}x", "`if` without `end`"),
        ("{{ if eq .Values.s 1 }}x{{ end }}", "unsupported if"),
        ("x{{ else }}y", "`else` without `if`"),
    ],
)
def test_the_renderer_refuses_what_it_does_not_know(template, error):
    with pytest.raises(TemplateError, match=re.escape(error)):
        render_helm_template(template, {"n": 2000000, "s": "x", "m": {}}, {}, {})
