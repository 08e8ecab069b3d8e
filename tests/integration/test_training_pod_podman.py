"""The retrain DAG's training pod, run for real in a container, without a cluster.

The training image is built from infra/docker/training.Dockerfile on a Debian base made here (podman.py);
the pod spec is the one KubernetesPodOperator renders for the DAG's `train` task under the cluster profile
(test_retrain_pod.py renders the same); `podman kube play` runs that spec: its Secret (made with `podman
secret create`), its claims (podman volumes of the claims' names: the shared volume bound to a folder that
holds a DVC-versioned training set, and the checkpoint claim), its security context (uid, read-only root),
and its own name through the downward API. No XCom sidecar: the pod records its result in the pod results
table of the promotion history's PostgreSQL database (core/pod_results.py), read back with the operator's
own call. MLflow is a real tracking server on this machine with basic auth and proxied artifacts
(`--serve-artifacts`), so the pod uploads its model over HTTP with no storage credentials. (MLflow's basic
auth needs its `auth` extra, which the lock does not carry; the Secret's values are checked in the
container's environment instead.)

What the spec is changed in before it is played, and why (it is checked on the YAML instead, by
test_retrain_pod.py and test_infra_k8s.py): CPU and memory limits are capped to this machine (podman refuses
limits above the host's CPUs).
`podman kube play` ignores runAsNonRoot, seccomp, scheduling fields and GPU resources.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import subprocess
import sys

import pytest
import yaml

from core import pod_results
from core.settings import Settings, get_settings
from orchestration import k8s_contract as contract
from tests.conftest import free_port, wait_for
from tests.integration import podman
from tests.integration.test_retrain_pod import parse_train_task, render_pod
from tests.integration.training_sets import AS_OF, versioned_training_set

pytestmark = pytest.mark.integration

IMAGE = podman.PROJECT_IMAGES["training_image"][1]
# The Secret's keys (infra/README.md): the MLflow client's login and the promotion history's DSN.
SECRET_VALUES = {
    "MLFLOW_TRACKING_USERNAME": "trainer",
    "MLFLOW_TRACKING_PASSWORD": secrets.token_urlsafe(12),
    "MLOPS_CLUSTER__POSTGRES_DSN": "postgresql://promotions@db.invalid:5432/promotions",
}


@pytest.fixture(scope="module")
def training_image(request) -> tuple[str, str]:
    return podman.project_image("training_image", request.session)


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A tracking server with basic auth and proxied artifacts, as infra/k8s/base/mlflow runs it."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
         "--serve-artifacts", "--artifacts-destination", str(root / "artifacts"),
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=(root / "server.log").open("w"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    try:
        try:
            wait_for(lambda: process.poll() is not None or _healthy(url), 120, f"the MLflow server at {url}")
        except TimeoutError as late:
            pytest.fail(f"{late}:\n{log.read_text()[-3000:]}")
        if process.poll() is not None:
            pytest.fail(f"the MLflow server exited {process.returncode}:\n{log.read_text()[-3000:]}")
        yield url, root / "artifacts"
    finally:  # also when it never answered: no server left behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 15)
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def shared_volume(tmp_path_factory) -> tuple[Settings, str]:
    """The shared volume as the pipeline leaves it: a DVC-versioned training set and the gold validation
    record of its as-of date, written by the real writers."""
    home = tmp_path_factory.mktemp("shared") / "mlops"
    settings = Settings(home=home)
    rev = versioned_training_set(settings, AS_OF)
    # The pod's user (10001) reads what the pipeline's user wrote; it writes nothing here.
    for path in [home, *home.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o005 | (0o001 if path.is_dir() else 0))
    return settings, rev


def _podman_yaml(pod: dict, base: str) -> dict:
    """The operator's pod, with the change the module docstring names."""
    pod = json.loads(json.dumps(pod))
    for container in pod["spec"]["containers"]:
        for kind in ("requests", "limits"):
            amounts = container.get("resources", {}).get(kind, {})
            if "cpu" in amounts:
                amounts["cpu"] = "1"
            if "memory" in amounts:
                amounts["memory"] = "4Gi"
    return pod


def _secret_manifest(name: str, values: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in values.items()},
    }


@pytest.fixture(scope="module")
def ledger_dsn():
    """A database of its own on this machine's PostgreSQL for the promotion history (the promote pod)."""
    import psycopg2

    name = f"mlops_pod_{secrets.token_hex(4)}"
    admin = psycopg2.connect("postgresql://postgres@127.0.0.1:5432/postgres")
    admin.autocommit = True
    admin.cursor().execute(f"CREATE DATABASE {name}")
    yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    admin.cursor().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.close()


@pytest.fixture(scope="module")
def cluster(training_image, mlflow_server, shared_volume, ledger_dsn, tmp_path_factory):
    """What an operator creates before the DAG runs (infra/README.md): the claims (podman volumes of the
    claims' names, bound to folders) and the training namespace's Secret (a podman secret)."""
    image, commit = training_image
    url, artifacts = mlflow_server
    settings, rev = shared_volume
    work = tmp_path_factory.mktemp("pod")
    checkpoints = work / "checkpoints"
    checkpoints.mkdir()
    checkpoints.chmod(0o777)
    env = {
        "MLOPS_TRAINING__IMAGE": image,
        "MLOPS_HOME": str(settings.home),
        "MLOPS_CLUSTER__MLFLOW_TRACKING_URI": url,
        "MLOPS_TRAINING__EPOCHS": "2",
        "MLOPS_TRAINING__BATCH_SIZE": "256",
    }
    _, cluster_settings = _render("train", env)
    secret_name = cluster_settings.training.credentials_secret
    # podman 4.3 resolves `envFrom: secretRef` to the podman secret of that name holding the Kubernetes
    # Secret's `data` (key -> base64 value) as JSON.
    secret_file = work / "secret.json"
    values = {**SECRET_VALUES, "MLOPS_CLUSTER__POSTGRES_DSN": ledger_dsn}
    secret_file.write_text(json.dumps(_secret_manifest(secret_name, values)["data"]))
    claims = {contract.DATA_CLAIM: settings.home, cluster_settings.training.checkpoint_claim: checkpoints}
    cleanup = [["secret", "rm", secret_name], *(["volume", "rm", "--force", claim] for claim in claims)]
    for args in cleanup:
        podman.run(args)
    pods: list[str] = []
    try:
        for claim, folder in claims.items():
            bind = ["--opt", "type=none", "--opt", "o=bind", "--opt", f"device={folder}"]
            done = podman.run(["volume", "create", *bind, claim])
            assert done.returncode == 0, done.stderr
        done = podman.run(["secret", "create", secret_name, str(secret_file)])
        assert done.returncode == 0, done.stderr
        yield {
            "env": env, "work": work, "pods": pods, "settings": settings, "rev": rev, "commit": commit,
            "image": image, "url": url, "artifacts": artifacts, "checkpoints": checkpoints, "secret": values,
            "results_url": ledger_dsn.replace("postgresql://", "postgresql+psycopg2://", 1),
        }  # fmt: skip
    finally:
        for name in pods:
            podman.run(["pod", "rm", "--force", name])
        for args in cleanup:
            podman.run(args)


def _render(task_id: str, env: dict[str, str], **xcoms: str) -> tuple[dict, Settings]:
    """The pod of the retrain DAG's `task_id` as the operator renders it under the cluster profile, its
    upstream XComs answered with `xcoms` (test_retrain_pod.StandInTaskInstance)."""
    from tests.integration import test_retrain_pod

    with pytest.MonkeyPatch.context() as monkeypatch:
        for name, value in xcoms.items():
            monkeypatch.setattr(test_retrain_pod, name, value)
        train, settings = parse_train_task(monkeypatch, **env)
        pod = render_pod(train.dag.get_task(task_id))
    get_settings.cache_clear()
    return pod, settings


def _play(cluster: dict, pod: dict) -> dict:
    """`podman kube play` the pod; wait for its base container; read the XCom as the operator does."""
    spec = _podman_yaml(pod, podman.base_image())
    name = spec["metadata"]["name"]
    pod_file = cluster["work"] / f"{name}.yaml"
    pod_file.write_text(yaml.safe_dump(spec))
    cluster["pods"].append(name)
    done = podman.run(["kube", "play", "--network", "host", str(pod_file)], timeout=600)
    assert done.returncode == 0, f"podman kube play failed:\n{done.stdout}\n{done.stderr}"
    trainer = f"{name}-{contract.TRAINING_CONTAINER}"
    waited = podman.run(["wait", trainer], timeout=900)
    logs = podman.run(["logs", trainer])
    inspect = json.loads(podman.run(["inspect", trainer]).stdout)[0]
    # What the operator does once the pod has succeeded: read the result the pod it followed recorded.
    try:
        result = pod_results.read(cluster["results_url"], pod["metadata"]["namespace"], name)
    except pod_results.PodResultMissingError:
        result = None
    podman.run(["pod", "rm", "--force", name])
    return {
        "pod": pod, "exit": waited.stdout.strip(), "logs": logs.stdout + logs.stderr, "inspect": inspect,
        "result": result,
    }  # fmt: skip


@pytest.fixture(scope="module")
def played(cluster):
    """The DAG's train task, rendered by the operator and played."""
    settings = cluster["settings"]
    pod, _ = _render("train", cluster["env"], TRAINING_SET_REV=cluster["rev"])
    before = sorted(str(p.relative_to(settings.home)) for p in settings.home.rglob("*"))
    outcome = _play(cluster, pod)
    after = sorted(str(p.relative_to(settings.home)) for p in settings.home.rglob("*"))
    # The image the node ran, as a kubelet reports it in the pod's status (`repository@sha256:...`): what
    # the operator adds to train's result for register's --image-id.
    inspect = outcome["inspect"]
    image_id = f"{inspect['ImageName'].rsplit(':', 1)[0]}@{inspect['ImageDigest']}"
    return {**cluster, **outcome, "home_before": before, "home_after": after, "image_id": image_id}


@pytest.fixture(scope="module")
def steps_played(cluster, played):
    """evaluate, register, promote and export after it, each its own pod of the training image, each
    rendered with the XComs its upstream pods returned."""
    assert played["result"], played["logs"][-4000:]
    run_id = played["result"]["run_id"]
    outcomes: dict[str, dict] = {}
    version = ""
    for step in ("evaluate", "register", "promote", "export"):
        pod, _ = _render(
            step, cluster["env"], MLFLOW_RUN=run_id, MODEL_VERSION=version, IMAGE_ID=played["image_id"]
        )
        outcomes[step] = _play(cluster, pod)
        assert outcomes[step]["exit"] == "0", f"{step}:\n{outcomes[step]['logs'][-6000:]}"
        if step == "register":
            version = str(outcomes[step]["result"]["model_version"])
    return outcomes


def test_the_training_pod_exits_0(played):
    assert played["exit"] == "0", played["logs"][-6000:]


def test_it_runs_as_uid_10001_with_a_read_only_root_and_a_read_only_shared_volume(played):
    inspect = played["inspect"]
    assert inspect["Config"]["User"].split(":")[0] == str(contract.TRAINING_UID)
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    mounts = {mount["Destination"]: mount for mount in inspect["Mounts"]}
    assert mounts[contract.DATA_MOUNT]["RW"] is False
    assert played["home_after"] == played["home_before"]  # the pod wrote nothing to the shared volume
    # What it wrote, it wrote as 10001: the checkpoint on its claim.
    written = [p for p in played["checkpoints"].rglob("*") if p.is_file()]
    assert written, "no checkpoint was written"
    assert {p.stat().st_uid for p in written} == {contract.TRAINING_UID}


def test_the_run_id_comes_back_through_the_pod_results_table(played):
    """Recorded under the pod's own name, which the downward API gave it: what the operator reads."""
    result = played["result"]
    assert result is not None, played["logs"][-4000:]
    assert result["status"] == "trained"
    assert result["training_set_rev"] == played["rev"]
    assert result["run_id"]


def test_the_run_is_in_mlflow_with_its_lineage_and_its_model_uploaded_over_http(played, monkeypatch):
    from mlflow import MlflowClient

    run_id = played["result"]["run_id"]
    client = MlflowClient(tracking_uri=played["url"], registry_uri=played["url"])
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["lineage.training_set_rev"] == played["rev"]
    assert tags["lineage.git_commit"] == played["commit"]
    assert tags["lineage.image"] == played["image"]
    assert tags["lineage.as_of"] == AS_OF.isoformat()
    assert tags["lineage.gx_success"] == "True"  # read from the shared volume's gold validation record
    assert tags["lineage.dag_id"] == "retrain_fraud_model"
    assert run.info.artifact_uri.startswith("mlflow-artifacts:")  # proxied: no storage credentials in the pod
    # The model came over HTTP into the server's artifact folder (MLflow 3 keeps logged models by model id,
    # under the experiment; this server has no other run).
    uploaded = [p for p in played["artifacts"].rglob("*") if p.is_file()]
    assert any(p.name == "MLmodel" for p in uploaded), uploaded
    # Exactly one run: the pod opened it once.
    runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run_id]


def test_the_secret_reaches_the_container_through_env_from(played):
    env = dict(item.split("=", 1) for item in played["inspect"]["Config"]["Env"])
    for key, value in played["secret"].items():
        assert env[key] == value, key
    spec_env = {item["name"] for c in played["pod"]["spec"]["containers"] for item in c.get("env") or []}
    assert not set(played["secret"]) & spec_env  # in the container only through the Secret


def test_the_played_spec_is_the_operators_own(played):
    """The pod that ran is the operator's rendering: its command, arguments, mounts and Secret."""
    (trainer,) = [c for c in played["pod"]["spec"]["containers"] if c["name"] == contract.TRAINING_CONTAINER]
    assert trainer["command"] == contract.training_command(1)
    assert trainer["args"][:3] == ["train", "--training-set-rev", played["rev"]]
    assert played["inspect"]["Config"]["Image"].endswith(IMAGE.split("/", 1)[1])


def test_the_steps_after_training_run_as_pods_of_the_training_image_up_to_a_champion(steps_played, played):
    """Everything the Airflow image cannot run (it has no torch or MLflow) runs in the training image:
    holdout metrics logged, a registered version, the gate's decision recorded in PostgreSQL, the ONNX
    export."""
    from mlflow import MlflowClient

    run_id = played["result"]["run_id"]
    assert steps_played["evaluate"]["result"]["run_id"] == run_id
    version = str(steps_played["register"]["result"]["model_version"])
    decision = steps_played["promote"]["result"]
    assert decision["decision"] == "promoted", decision  # the first model against the floor
    assert str(decision["champion_version"]) == version
    assert "parity_max_abs_diff" in steps_played["export"]["result"]
    client = MlflowClient(tracking_uri=played["url"], registry_uri=played["url"])
    assert client.get_model_version_by_alias("fraud-detector", "champion").version == version
    metrics = client.get_run(run_id).data.metrics
    assert "onnx_parity_max_abs_diff" in metrics


def test_the_model_version_records_the_image_the_pod_ran_by_digest(steps_played, played):
    """The tag names an image that can be pushed again; the digest podman reports names what ran."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=played["url"], registry_uri=played["url"])
    version = str(steps_played["register"]["result"]["model_version"])
    tags = client.get_model_version("fraud-detector", version).tags
    assert played["inspect"]["ImageDigest"].startswith("sha256:")
    assert tags["lineage.image_digest"] == played["inspect"]["ImageDigest"]
    assert tags["lineage.image_id"] == played["image_id"]
    assert (
        client.get_run(played["result"]["run_id"]).data.tags["lineage.image_digest"]
        == tags["lineage.image_digest"]
    )
