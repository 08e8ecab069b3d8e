from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestration import k8s_contract as contract

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
OVERLAYS_DIR = INFRA / "k8s" / "overlays"
OVERLAYS = sorted(path.name for path in OVERLAYS_DIR.iterdir() if (path / "kustomization.yaml").exists())


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated Airflow metadata database (SQLite) in this test session's AIRFLOW_HOME."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    airflow = Path(sys.executable).with_name("airflow")
    subprocess.run(
        [str(airflow), "db", "migrate"], check=True, capture_output=True, env=os.environ.copy(), timeout=600
    )
    return home


# --- infra/k8s: tools, rendered overlays and the checks shared by test_infra_k8s.py and test_retrain_pod.py


@dataclass(frozen=True)
class InfraTools:
    python: Path
    checkov: Path


@pytest.fixture(scope="session")
def infra_tools() -> InfraTools:
    venv = REPO / os.environ.get("INFRA_VENV", ".venv-infra")
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "infra_tools.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/infra_tools.sh failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return InfraTools(python=venv / "bin" / "python", checkov=venv / "bin" / "checkov")


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        # A fresh machine may lack it: install Debian's client, as a developer would.
        subprocess.run(["apt-get", "update", "-qq"], capture_output=True, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "kubernetes-client"], capture_output=True, timeout=600
        )
        path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH; the overlays are rendered with `kubectl kustomize` "
            "(Debian: apt-get install kubernetes-client)"
        )
    return path


@pytest.fixture(scope="session")
def rendered(kubectl: str) -> dict[str, list[dict[str, Any]]]:
    """Every overlay rendered to its list of objects."""
    out = {}
    for overlay in OVERLAYS:
        done = subprocess.run(
            [kubectl, "kustomize", str(OVERLAYS_DIR / overlay)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"kubectl kustomize {overlay}: {done.stderr}"
        out[overlay] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return out


def schema_errors(tools: InfraTools, objects: list[dict[str, Any]]) -> list[str]:
    done = subprocess.run(
        [
            str(tools.python),
            str(INFRA / "tools" / "k8s_schema_check.py"),
            "--kubernetes-version",
            contract.KUBERNETES_VERSION,
        ],
        input=json.dumps(objects),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    verdicts = json.loads(done.stdout)
    assert len(verdicts) == len(objects)
    return [f"{v['kind']}/{v['name']}: {v['error']}" for v in verdicts if v["error"]]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None, namespace: str | None = None):
    return [
        obj
        for obj in objects
        if obj["kind"] == kind
        and (name is None or obj["metadata"]["name"] == name)
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]


def one(objects, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    (found,) = find(objects, kind, name, namespace)
    return found


def quota_and_limits(objects) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The training namespace's ResourceQuota `spec.hard` and its LimitRange items, as rendered."""
    quota = one(objects, "ResourceQuota", "training-compute", contract.TRAINING_NAMESPACE)["spec"]["hard"]
    limit_items = [
        item
        for limit_range in find(objects, "LimitRange", namespace=contract.TRAINING_NAMESPACE)
        for item in limit_range["spec"]["limits"]
    ]
    return quota, limit_items


# Which namespaces write to the shared filesystem (infra/README.md, "Storage"): Airflow's tasks and MLflow do,
# training and serving only read it, and their volumes and mounts are read-only.
DATA_WRITABLE = {
    contract.ORCHESTRATION_NAMESPACE: True,
    contract.TRAINING_NAMESPACE: False,
    contract.SERVING_NAMESPACE: False,
}
# The one part of the shared filesystem mounted on its own: MLflow's artifact folder, at /mlflow-artifacts.
DATA_SUBPATH_MOUNTS = {contract.MLFLOW_ARTIFACTS_SUBPATH: f"/{contract.MLFLOW_ARTIFACTS_SUBPATH}"}


def data_claim_mounts(pod_spec: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(container, volume, mount) for every mount of the claim contract.DATA_CLAIM in this PodSpec."""
    volumes = {
        volume["name"]: volume
        for volume in pod_spec.get("volumes") or []
        if (volume.get("persistentVolumeClaim") or {}).get("claimName") == contract.DATA_CLAIM
    }
    return [
        (container["name"], volumes[mount["name"]], mount)
        for field in ("initContainers", "containers")
        for container in pod_spec.get(field) or []
        for mount in container.get("volumeMounts") or []
        if mount["name"] in volumes
    ]


def data_claim_mount_problems(namespace: str, pod_spec: dict[str, Any]) -> list[str]:
    """Why this pod's mounts of the shared filesystem break the storage design; empty when they do not. The
    whole claim goes at contract.DATA_MOUNT (and MLOPS_HOME, where a container sets it, is that path), a
    sub-folder only as DATA_SUBPATH_MOUNTS says, and in read-only namespaces every mount is read-only."""
    problems = []
    for container, volume, mount in data_claim_mounts(pod_spec):
        where = f"{namespace} {container}: {mount['mountPath']}"
        sub_path = mount.get("subPath")
        if sub_path is None and mount["mountPath"] != contract.DATA_MOUNT:
            problems.append(f"{where}: the claim must be mounted at {contract.DATA_MOUNT}")
        if sub_path is not None and DATA_SUBPATH_MOUNTS.get(sub_path) != mount["mountPath"]:
            problems.append(f"{where}: subPath {sub_path} is not one of {DATA_SUBPATH_MOUNTS}")
        if not DATA_WRITABLE[namespace]:
            if not mount.get("readOnly"):
                problems.append(f"{where}: must be mounted readOnly in {namespace}")
            if not volume["persistentVolumeClaim"].get("readOnly"):
                problems.append(
                    f"{where}: the volume's persistentVolumeClaim must be readOnly in {namespace}"
                )
    mounted_in = {
        container
        for container, _, mount in data_claim_mounts(pod_spec)
        if "subPath" not in mount and mount["mountPath"] == contract.DATA_MOUNT
    }
    for field in ("initContainers", "containers"):
        for container in pod_spec.get(field) or []:
            home = [e.get("value") for e in container.get("env") or [] if e["name"] == "MLOPS_HOME"]
            if home and (home != [contract.DATA_MOUNT] or container["name"] not in mounted_in):
                problems.append(
                    f"{namespace} {container['name']}: MLOPS_HOME={home} without the claim mounted there"
                )
    return problems
