"""infra/README.md's storage and deploy steps against what they describe: every Secret (with its keys), claim,
volume, namespace, object and `MLOPS_*` variable the steps name must exist in the rendered manifests,
infra/helm/airflow/values.yaml or the code, and every Secret those refer to must be in the README's table. A
rename on one side only fails here instead of at deploy time, when an operator follows the README.

What is extracted, and how (kept literal so a reader can check it against the README):
- the Secrets table: rows `| <namespace> | `<Secret>` [(optional)] | <keys> | <used by> |`, the keys being the
  backticked words of the keys column outside parentheses;
- `kubectl -n <namespace> ...` commands (continued lines joined): `create secret generic <name>` with its
  `--from-literal=<key>=` / `--from-file=<key>`, `get pvc <name>`, `rollout status deploy/<name>`;
- backticked names starting with mlops-, mlflow-, feast- or airflow- in the "Storage" and deploy sections;
- every `MLOPS_*` word anywhere in the file.
"""

from __future__ import annotations

import re
import sys
from typing import Any

import pytest
import yaml

from core.settings import ClusterServices, TrainingSettings, setting_env_names
from orchestration import k8s_contract as contract
from tests.integration.conftest import INFRA, OVERLAYS, REPO

README = (INFRA / "README.md").read_text()
VALUES = yaml.safe_load((INFRA / "helm" / "airflow" / "values.yaml").read_text())
NAMESPACES = {contract.ORCHESTRATION_NAMESPACE, contract.TRAINING_NAMESPACE, contract.SERVING_NAMESPACE}
# The keys the Airflow chart reads from the Secrets its values name (fixed by the chart, not by us).
CHART_SECRET_KEYS = {
    ("data", "metadataSecretName"): "connection",
    ("fernetKeySecretName",): "fernet-key",
    ("apiSecretKeySecretName",): "api-secret-key",
    ("jwtSecretName",): "jwt-secret",
}
# Variables read by MLflow's client rather than by core.settings.
MLFLOW_VARIABLES = {
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_ALLOW_PICKLE_DESERIALIZATION",
}
KUBECTL_KINDS = {"deploy": "Deployment", "deployment": "Deployment", "pvc": "PersistentVolumeClaim"}
OUR_NAME = re.compile(r"(mlops|mlflow|feast|airflow)-[a-z0-9-]*[a-z0-9]")
WHOLE = None  # a Secret referenced whole (envFrom, or a volume without items): every key is visible


def section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


DEPLOY = section("Storage") + section("Deploying to a real cluster")


def outside_parentheses(text: str) -> str:
    """`text` without its parenthesised asides; parentheses inside backticks do not count."""
    kept, depth, in_code = [], 0, False
    for char in text:
        if char == "`":
            in_code = not in_code
        elif not in_code and char == "(":
            depth += 1
            continue
        elif not in_code and char == ")":
            depth -= 1
            continue
        if depth == 0:
            kept.append(char)
    return "".join(kept)


def secrets_table() -> dict[tuple[str, str], set[str]]:
    """(namespace, Secret) -> its keys, from the README's table of Secrets to create."""
    rows = re.findall(
        r"^\| (mlops-[a-z]+) \| `([a-z0-9.-]+)`(?: \(optional\))? \| (.+?) \| .+ \|$", DEPLOY, re.M
    )
    table = {}
    for namespace, name, keys in rows:
        assert (namespace, name) not in table, f"{name} is in the table twice"
        table[(namespace, name)] = set(re.findall(r"`([^`]+)`", outside_parentheses(keys)))
    return table


def kubectl_commands() -> list[tuple[str, str]]:
    """(namespace, the rest of the command) for each `kubectl -n` command, continued lines joined."""
    joined = DEPLOY.replace("\\\n", " ")
    return re.findall(r"kubectl -n (\S+) ([^\n`]+)", joined)


def _pod_specs(objects) -> list[tuple[str, dict[str, Any]]]:
    return [
        (obj["metadata"]["namespace"], spec)
        for obj in objects
        if (spec := contract.workload_pod_spec(obj)) is not None
    ]


def secret_references(objects) -> dict[tuple[str, str], set[str | None]]:
    """(namespace, Secret) -> the keys referred to (WHOLE for a Secret taken whole), from the rendered pods,
    the Helm values (orchestration namespace) and the settings (the training pods' credentials Secret)."""
    refs: dict[tuple[str, str], set[str | None]] = {}

    def add(namespace: str, name: str, key: str | None) -> None:
        refs.setdefault((namespace, name), set()).add(key)

    for namespace, spec in _pod_specs(objects):
        for field in ("initContainers", "containers"):
            for container in spec.get(field) or []:
                for item in container.get("env") or []:
                    if ref := (item.get("valueFrom") or {}).get("secretKeyRef"):
                        add(namespace, ref["name"], ref["key"])
                for item in container.get("envFrom") or []:
                    if "secretRef" in item:
                        add(namespace, item["secretRef"]["name"], WHOLE)
        for volume in spec.get("volumes") or []:
            if secret := volume.get("secret"):
                for key in [item["key"] for item in secret.get("items") or []] or [WHOLE]:
                    add(namespace, secret["secretName"], key)
    orchestration = contract.ORCHESTRATION_NAMESPACE
    for path, key in CHART_SECRET_KEYS.items():
        node: Any = VALUES
        for part in path:
            node = node[part]
        add(orchestration, node, key)
    for entry in VALUES["secret"]:
        add(orchestration, entry["secretName"], entry["secretKey"])
    # Secrets the chart mounts as volumes in every Airflow container (the pseudonym key).
    for volume in VALUES.get("volumes") or []:
        if secret := volume.get("secret"):
            for key in [item["key"] for item in secret.get("items") or []] or [WHOLE]:
                add(orchestration, secret["secretName"], key)
    # The retrain DAG's pods take this Secret whole (envFrom): each key becomes a variable.
    add(ClusterServices().kubernetes_namespace, TrainingSettings().credentials_secret, WHOLE)
    add(ClusterServices().kubernetes_namespace, TrainingSettings().promotion_credentials_secret, WHOLE)
    return refs


def known_names(objects) -> set[str]:
    names = {obj["metadata"]["name"] for obj in objects} | NAMESPACES
    names |= {name for _, name in secret_references(objects)}
    names |= set(contract.DATA_VOLUMES.values()) | {contract.DATA_CLAIM, contract.MLFLOW_ARTIFACTS_SUBPATH}
    names |= {contract.TRAINING_IMAGE_REPOSITORY, contract.AIRFLOW_IMAGE_REPOSITORY}
    names |= {VALUES[component]["serviceAccount"]["name"] for component in ("workers", "triggerer")}
    names |= {TrainingSettings().checkpoint_claim}
    return names


def test_the_extraction_finds_what_the_deploy_steps_name():
    table = secrets_table()
    assert len(table) >= 12
    assert table[(contract.TRAINING_NAMESPACE, "mlops-training-credentials")] == {
        "MLOPS_CLUSTER__POSTGRES_DSN",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    }
    assert table[(contract.ORCHESTRATION_NAMESPACE, "airflow-fernet-key")] == {"fernet-key"}
    assert table[(contract.ORCHESTRATION_NAMESPACE, "mlflow-admin")] == {"admin-password", "flask-secret-key"}
    commands = kubectl_commands()
    assert any(rest.startswith("create secret generic mlops-training-credentials") for _, rest in commands)
    assert any(rest.startswith("get pvc ") for _, rest in commands)
    assert outside_parentheses("`a` (`b (c)` d) `e`") == "`a`  `e`"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_in_the_table_is_used_under_that_name_namespace_and_keys(rendered, overlay):
    refs = secret_references(rendered[overlay])
    settings_names = set(setting_env_names())
    for (namespace, name), keys in secrets_table().items():
        assert namespace in NAMESPACES, name
        used = refs.get((namespace, name))
        assert used, f"README names Secret {namespace}/{name}, which nothing in infra/ or the code uses"
        named = used - {WHOLE}
        assert named <= keys, f"{namespace}/{name}: keys {sorted(named - keys)} are used but not in README"
        if WHOLE not in used:
            assert keys <= named, f"{namespace}/{name}: README keys {sorted(keys - named)} are used nowhere"
    # A Secret taken whole as environment variables: each key must be a variable something reads.
    credentials = (ClusterServices().kubernetes_namespace, TrainingSettings().credentials_secret)
    unknown = secrets_table()[credentials] - settings_names - MLFLOW_VARIABLES
    assert unknown == set(), f"{credentials[1]}: keys that no setting or MLflow variable reads"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_secret_the_manifests_values_and_code_use_is_in_the_readme(rendered, overlay):
    missing = set(secret_references(rendered[overlay])) - set(secrets_table())
    assert missing == set(), "document these Secrets in infra/README.md, step 3"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_kubectl_command_names_existing_namespaces_objects_and_secret_keys(rendered, overlay):
    objects = rendered[overlay]
    table = secrets_table()
    for namespace, rest in kubectl_commands():
        assert namespace in NAMESPACES, rest
        if match := re.match(r"create secret generic (\S+)", rest):
            name = match.group(1)
            assert (namespace, name) in table, f"kubectl creates {namespace}/{name}, not in the Secrets table"
            keys = set(re.findall(r"--from-literal=([^=\s]+)=", rest))
            keys |= {path.rsplit("/", 1)[-1] for path in re.findall(r"--from-file=([^\s=]+)", rest)}
            assert keys and keys <= table[(namespace, name)], f"{rest}: keys not in the table"
        elif match := re.match(r"(?:get (pvc) (\S+)|rollout status (deploy)/(\S+))", rest):
            kind_word, name = (match.group(1), match.group(2)) if match.group(1) else match.group(3, 4)
            kind = KUBECTL_KINDS[kind_word]
            found = [
                obj
                for obj in objects
                if obj["kind"] == kind
                and obj["metadata"]["name"] == name
                and obj["metadata"].get("namespace") == namespace
            ]
            assert found, f"kubectl -n {namespace} {rest}: no {kind} {name} there"
        else:
            pytest.fail(f"kubectl -n {namespace} {rest}: teach this test what the command names")
    # `kubectl get pv -l <label>` lists every volume of the shared filesystem.
    (selector,) = re.findall(r"kubectl get pv -l (\S+)=(\S+)", DEPLOY)
    labelled = {
        obj["metadata"]["name"]
        for obj in objects
        if obj["kind"] == "PersistentVolume" and obj["metadata"]["labels"].get(selector[0]) == selector[1]
    }
    assert labelled == set(contract.DATA_VOLUMES.values())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_name_the_storage_and_deploy_steps_give_exists(rendered, overlay):
    named = {token for token in re.findall(r"`([^`\n]+)`", DEPLOY) if OUR_NAME.fullmatch(token)}
    assert {contract.DATA_CLAIM, *contract.DATA_VOLUMES.values()} <= named
    assert named - known_names(rendered[overlay]) == set(), "renamed in the manifests or the code?"


# Variables the code reads directly, not settings: each must still be read where this says.
CODE_VARIABLES = {
    "MLOPS_GIT_COMMIT": REPO / "training" / "tracking.py",
    "MLOPS_POD_NAME": REPO / "core" / "pod_results.py",  # the downward API's: a pod's own name
}


def test_every_mlops_variable_the_readme_names_is_a_setting_or_read_by_the_code():
    named = set(re.findall(r"\bMLOPS_[A-Z0-9_]+\b", README))
    assert "MLOPS_CLUSTER__POSTGRES_DSN" in named
    for variable, reader in CODE_VARIABLES.items():
        assert f'"{variable}"' in reader.read_text(), f"{reader} no longer reads {variable}"
    assert named - set(setting_env_names()) - set(CODE_VARIABLES) == set()


def test_the_checks_catch_a_renamed_secret_and_a_misspelt_variable(rendered, monkeypatch):
    """The checks above against a README with one Secret renamed and one variable misspelt."""
    broken = README.replace("`mlops-postgres-dsn`", "`mlops-promotions-dsn`").replace(
        "MLOPS_TRAINING__CREDENTIALS_SECRET", "MLOPS_TRAINING__CREDENTIAL_SECRET"
    )
    monkeypatch.setattr(sys.modules[__name__], "DEPLOY", broken)
    table, refs = secrets_table(), secret_references(rendered[OVERLAYS[0]])
    assert set(table) - set(refs) == {(contract.ORCHESTRATION_NAMESPACE, "mlops-promotions-dsn")}
    assert set(refs) - set(table) == {(contract.ORCHESTRATION_NAMESPACE, "mlops-postgres-dsn")}
    misspelt = (
        set(re.findall(r"\bMLOPS_[A-Z0-9_]+\b", broken)) - set(setting_env_names()) - set(CODE_VARIABLES)
    )
    assert misspelt == {"MLOPS_TRAINING__CREDENTIAL_SECRET"}
