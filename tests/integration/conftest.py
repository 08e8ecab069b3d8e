from __future__ import annotations

import copy
import json
import os
import re
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


POSTGRES = "postgresql+psycopg2://postgres@127.0.0.1:5432"


@pytest.fixture
def postgres_database():
    """A PostgreSQL database of its own on this machine's server (its SQLAlchemy URL), dropped after."""
    import uuid

    import sqlalchemy as sa

    name = f"mlops_t_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(f"{POSTGRES}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    yield f"{POSTGRES}/{name}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
    admin.dispose()


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """A migrated Airflow metadata database (SQLite) in this test session's AIRFLOW_HOME: a copy of the one
    migrated for this lock file and Python (`cached_file`), migrated here first where there is none."""
    home = Path(os.environ["AIRFLOW_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    database = home / "airflow.db"
    assert os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].endswith(f"/{database}")
    shutil.copy(migrated_airflow_db(), database)
    return home


def migrated_airflow_db() -> Path:
    """The cached, freshly migrated Airflow metadata database (no DAG in it yet): copy it, never write it. A
    test that needs Airflow's own first parse must start from this, not from the session's database, which the
    tests before it may have filled (their DAGs already there, active)."""
    key_parts = [(REPO / "requirements.lock").read_bytes(), sys.version.encode(), b"airflow db migrate"]
    return cached_file("airflow-db", key_parts, _migrate_airflow_db)


def _migrate_airflow_db(target: Path) -> None:
    """`airflow db migrate` into an empty SQLite file `target` (the session's Airflow settings otherwise)."""
    airflow = Path(sys.executable).with_name("airflow")
    env = os.environ | {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{target}"}
    subprocess.run([str(airflow), "db", "migrate"], check=True, capture_output=True, env=env, timeout=600)


def cached_file(name: str, key_parts: list[bytes], build) -> Path:
    """A file that `build(path)` writes, kept in the tests' cache (tests/lake.py `cache_root`) under a hash
    of `key_parts`: built where that key's file is missing (an older key's is removed), printed either way.
    One builder at a time across processes; a file is only ever renamed in whole."""
    import hashlib

    from tests.conftest import machine_lock
    from tests.lake import cache_root

    digest = hashlib.sha256()
    for part in key_parts:
        digest.update(hashlib.sha256(part).digest())
    key = digest.hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    cached = root / f"{name}-{key}"
    with machine_lock(f"cache-{name}"):
        if cached.is_file():
            print(f"test cache: {cached.name} kept")
            return cached
        for stale in root.glob(f"{name}-*"):
            stale.unlink()
        staging = root / f".{name}-{key}.{os.getpid()}"
        build(staging)
        os.rename(staging, cached)
        print(f"test cache: {cached.name} built")
    return cached


def dag_run_states(run) -> dict[str, str]:
    """Each task's state in a run `dag.test` made (task id -> state)."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter(
            TaskInstance.run_id == run.run_id, TaskInstance.dag_id == run.dag_id
        )
        return {ti.task_id: str(ti.state) for ti in rows}


# --- infra/k8s: tools, rendered overlays and the checks shared by test_infra_k8s.py and test_retrain_pod.py


@dataclass(frozen=True)
class InfraTools:
    python: Path
    checkov: Path


@pytest.fixture(scope="session")
def infra_tools() -> InfraTools:
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "infra_tools.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/infra_tools.sh failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    # The script prints the venv it built or reused (a folder of the user's cache, keyed by content).
    venv = Path(done.stdout.strip().splitlines()[-1])
    return InfraTools(python=venv / "bin" / "python", checkov=venv / "bin" / "checkov")


# The overlays use kustomize's `labels` field (kustomize 4.1, first bundled with kubectl 1.22; our machines
# have 1.32). Debian 12's kubernetes-client is 1.20: its kustomize answers `json: unknown field "labels"` for
# every overlay, so it is no fallback, and the fixture does not install it.
KUBECTL_MINIMUM = (1, 22)


def kubectl_version(path: str) -> tuple[int, int]:
    """The client's (major, minor), from `kubectl version --client -o json`."""
    command = [path, "version", "--client", "-o", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        pytest.fail(f"{path} version --client failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    client = json.loads(done.stdout)["clientVersion"]
    return int(client["major"]), int(client["minor"].rstrip("+"))  # a vendor's build reads "32+"


@pytest.fixture(scope="session")
def kubectl() -> str:
    """The machine's kubectl, whose `kubectl kustomize` renders the overlays: checked for its version first,
    so an old client fails here with what to do rather than in every rendering test."""
    needed = "{}.{} or newer".format(*KUBECTL_MINIMUM)
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl is not on PATH; the overlays are rendered with `kubectl kustomize`: install kubectl "
            f"{needed} (https://kubernetes.io/docs/tasks/tools/)"
        )
    version = kubectl_version(path)
    if version < KUBECTL_MINIMUM:
        pytest.fail(
            f"{path} is kubectl {version[0]}.{version[1]}; the overlays need {needed} (their kustomize "
            "`labels` field): install a newer kubectl (Debian 12's kubernetes-client is 1.20, too old)"
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


# Which namespaces write the whole shared filesystem (infra/README.md, "Storage"): Airflow's tasks and MLflow
# do; training and serving read it, and every mount of it there is read-only, but for the folders below.
DATA_WRITABLE = {
    contract.ORCHESTRATION_NAMESPACE: True,
    contract.TRAINING_NAMESPACE: False,
    contract.SERVING_NAMESPACE: False,
}
# The scoring service's log, $MLOPS_HOME/scoring_log (core.settings.Settings.scoring_log_dir).
SCORING_LOG_SUBPATH = "scoring_log"
# Batch scoring's decisions, $MLOPS_HOME/lake/decisions (serving/batch.py), written by its training-image pod.
DECISIONS_SUBPATH = "lake/decisions"
# Folders a namespace that otherwise only reads may write: each mounted on its own (a subPath), read-write.
DATA_WRITABLE_SUBPATHS: dict[str, frozenset[str]] = {
    contract.ORCHESTRATION_NAMESPACE: frozenset(),
    contract.TRAINING_NAMESPACE: frozenset({DECISIONS_SUBPATH}),
    contract.SERVING_NAMESPACE: frozenset({SCORING_LOG_SUBPATH}),
}
# Whether each namespace's volume of the export is writable at all (read-only on the volume itself otherwise).
DATA_VOLUME_WRITABLE = {
    namespace: writable or bool(DATA_WRITABLE_SUBPATHS[namespace])
    for namespace, writable in DATA_WRITABLE.items()
}
# The parts of the shared filesystem mounted on their own, and where: MLflow's artifact folder at
# /mlflow-artifacts, the scoring log where MLOPS_HOME puts it.
DATA_SUBPATH_MOUNTS = {
    contract.MLFLOW_ARTIFACTS_SUBPATH: f"/{contract.MLFLOW_ARTIFACTS_SUBPATH}",
    SCORING_LOG_SUBPATH: f"{contract.DATA_MOUNT}/{SCORING_LOG_SUBPATH}",
    DECISIONS_SUBPATH: f"{contract.DATA_MOUNT}/{DECISIONS_SUBPATH}",
}


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
    sub-folder only as DATA_SUBPATH_MOUNTS says, and in read-only namespaces every mount is read-only but a
    subPath mount of one of the namespace's DATA_WRITABLE_SUBPATHS; the pod's volume of the claim is
    read-only there unless such a mount needs it writable."""
    problems = []
    mounts = data_claim_mounts(pod_spec)
    writable_volumes = {
        volume["name"]
        for _, volume, mount in mounts
        if mount.get("subPath") in DATA_WRITABLE_SUBPATHS[namespace] and not mount.get("readOnly")
    }
    for container, volume, mount in mounts:
        where = f"{namespace} {container}: {mount['mountPath']}"
        sub_path = mount.get("subPath")
        if sub_path is None and mount["mountPath"] != contract.DATA_MOUNT:
            problems.append(f"{where}: the claim must be mounted at {contract.DATA_MOUNT}")
        if sub_path is not None and DATA_SUBPATH_MOUNTS.get(sub_path) != mount["mountPath"]:
            problems.append(f"{where}: subPath {sub_path} is not one of {DATA_SUBPATH_MOUNTS}")
        if not DATA_WRITABLE[namespace]:
            if not mount.get("readOnly") and sub_path not in DATA_WRITABLE_SUBPATHS[namespace]:
                problems.append(f"{where}: must be mounted readOnly in {namespace}")
            if not volume["persistentVolumeClaim"].get("readOnly") and volume["name"] not in writable_volumes:
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


# --- infra/helm/fraud-scoring, rendered without helm -------------------------------------------------------
#
# No helm binary reaches this machine (nor CI's), so the chart is rendered by the small renderer below, which
# knows exactly the template language the chart uses and refuses anything else: actions with Go's trim markers
# (`{{- ` and ` -}}`), values (`.Values.a.b`, `.Release.Name|Namespace|Service`, `.Chart.Name|Version|
# AppVersion`), `range $key, $value := <map or list>` (a map's keys in sorted order, as Go ranges over a
# map; a list's index and element in order) ... `end`,
# `if <value's path>` ... [`else` ...] `end` (Go's truth: false, 0, nil and empty are false), and
# the functions quote, toYaml, nindent and indent with Helm's (sprig's) meanings. A value printed or quoted
# must be a string: Helm prints numbers of a values file as floats (2e+06), so the values file has none.
# `helm lint` / `helm template` remain the deploy-time check (infra/README.md).

CHART_DIR = INFRA / "helm" / "fraud-scoring"
_ACTION = re.compile(r"\{\{(- )?(.*?)( -)?\}\}", re.DOTALL)
_RANGE = re.compile(r"range \$(\w+), \$(\w+) := (\S+)")
_IF = re.compile(r"\.[A-Za-z][\w.]*")


class TemplateError(ValueError):
    """The template uses something the renderer does not know, or names a value that is not there."""


def _template_tree(text: str) -> list[Any]:
    """Text and actions, trim markers applied, `range` ... `end` nested: [str | ("action", expr) |
    ("range", key, value, expr, body)]."""
    pieces: list[Any] = []
    position, trim_next = 0, False
    for match in _ACTION.finditer(text):
        before = text[position : match.start()]
        if trim_next:
            before = before.lstrip()
        if match.group(1):
            before = before.rstrip()
        pieces += [before, ("action", match.group(2).strip())]
        position, trim_next = match.end(), bool(match.group(3))
    rest = text[position:]
    pieces.append(rest.lstrip() if trim_next else rest)
    if "{{" in "".join(p for p in pieces if isinstance(p, str)):
        raise TemplateError("an action without its trim markers' spaces or closing braces")

    def nest(items: list[Any], inside: str | None) -> tuple[list[Any], list[Any], str | None]:
        """(tree, the items after it, what closed it: `end` or `else`)."""
        tree: list[Any] = []
        while items:
            item, items = items[0], items[1:]
            if isinstance(item, str):
                tree.append(item)
            elif item[1] in ("end", "else"):
                if inside is None or (item[1] == "else" and inside != "if"):
                    raise TemplateError(f"`{item[1]}` without `if` or `range`")
                return tree, items, item[1]
            elif item[1].startswith("range "):
                match = _RANGE.fullmatch(item[1])
                if not match:
                    raise TemplateError(f"unsupported range: {item[1]}")
                body, items, _ = nest(items, "range")
                tree.append(("range", *match.groups(), body))
            elif item[1].startswith("if "):
                condition = item[1][3:].strip()
                if not _IF.fullmatch(condition):
                    raise TemplateError(f"unsupported if: {item[1]} (a value's path only)")
                then, items, closed = nest(items, "if")
                otherwise: list[Any] = []
                if closed == "else":
                    otherwise, items, _ = nest(items, "else")
                tree.append(("if", condition, then, otherwise))
            else:
                tree.append(item)
        if inside is not None:
            raise TemplateError(f"`{inside}` without `end`")
        return tree, items, None

    return nest(pieces, None)[0]


def _lookup(path: str, scope: dict[str, Any]) -> Any:
    node: Any
    if path.startswith("$"):  # a variable, or a field of one ($item.name)
        name, _, rest = path[1:].partition(".")
        if name not in scope["vars"]:
            raise TemplateError(f"undefined variable ${name}")
        node, parts = scope["vars"][name], rest.split(".") if rest else []
    elif path.startswith("."):
        node, parts = scope["root"], path[1:].split(".")
    else:
        raise TemplateError(f"unsupported term: {path}")
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            raise TemplateError(f"{path}: no such value")
        node = node[part]
    return node


def _quote(value: Any) -> str:
    if not isinstance(value, str):
        raise TemplateError(f"quote of {value!r}: write it as a string in the values")
    return json.dumps(value)


def _indent(spaces: str, text: str) -> str:
    pad = " " * int(spaces)
    return pad + text.replace("\n", "\n" + pad)


_FUNCTIONS = {
    "quote": _quote,
    # sigs.k8s.io/yaml's Marshal, with Helm's trailing newline removed.
    "toYaml": lambda value: yaml.safe_dump(value, sort_keys=True, default_flow_style=False).rstrip("\n"),
    "indent": _indent,
    "nindent": lambda spaces, text: "\n" + _indent(spaces, text),
}


def _evaluate(expr: str, scope: dict[str, Any]) -> str:
    value: Any = None
    for index, command in enumerate(part.split() for part in expr.split("|")):
        if not command:
            raise TemplateError(f"empty command in {expr!r}")
        name, args = command[0], command[1:]
        if name in _FUNCTIONS:
            arguments = [a if a.isdigit() else _lookup(a, scope) for a in args]
            value = _FUNCTIONS[name](*arguments, *([value] if index else []))
        elif index == 0 and not args:
            value = _lookup(name, scope)
        else:
            raise TemplateError(f"unsupported command {' '.join(command)!r} in {expr!r}")
    if not isinstance(value, str):
        raise TemplateError(f"{expr!r} prints {value!r}: write it as a string in the values")
    return value


def _render_tree(tree: list[Any], scope: dict[str, Any]) -> str:
    out = []
    for node in tree:
        if isinstance(node, str):
            out.append(node)
        elif node[0] == "action":
            out.append(_evaluate(node[1], scope))
        elif node[0] == "if":
            # Go's truth: false, 0, nil and an empty string, list or map are false
            _, path, then, otherwise = node
            out.append(_render_tree(then if _lookup(path, scope) else otherwise, scope))
        else:
            _, key_name, value_name, path, body = node
            mapping = _lookup(path, scope)
            if isinstance(mapping, list):  # a list: its index and element, in order
                items = [(str(index), item) for index, item in enumerate(mapping)]
            elif isinstance(mapping, dict):
                items = [(key, mapping[key]) for key in sorted(mapping)]
            else:
                raise TemplateError(f"range over {path}, which is neither a map nor a list")
            for key, value in items:
                inner = {**scope, "vars": {**scope["vars"], key_name: key, value_name: value}}
                out.append(_render_tree(body, inner))
    return "".join(out)


def render_helm_template(text: str, values: dict[str, Any], release: dict[str, str], chart: dict[str, str]):
    root = {"Values": values, "Release": release, "Chart": chart}
    return _render_tree(_template_tree(text), {"root": root, "vars": {}})


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` deep-merged into a copy of `base`, as Helm merges --set and -f values into the chart's."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render_chart(
    chart_dir: Path = CHART_DIR,
    overrides: dict[str, Any] | None = None,
    namespace: str = contract.SERVING_NAMESPACE,
    release_name: str = "fraud-scoring",
) -> list[dict[str, Any]]:
    """`helm template <release_name> <chart_dir> --namespace <namespace>` with `overrides`, as objects."""
    meta = yaml.safe_load((chart_dir / "Chart.yaml").read_text())
    chart = {key[0].upper() + key[1:]: str(value) for key, value in meta.items()}
    values = merged(yaml.safe_load((chart_dir / "values.yaml").read_text()) or {}, overrides or {})
    release = {"Name": release_name, "Namespace": namespace, "Service": "Helm"}
    objects = []
    for template in sorted((chart_dir / "templates").glob("*.yaml")):
        text = render_helm_template(template.read_text(), values, release, chart)
        objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects
