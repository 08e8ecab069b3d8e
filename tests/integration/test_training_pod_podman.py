"""Every pod kind the DAGs launch, and the scoring service, run for real in containers, without a cluster.

The training and scoring images are built from infra/docker/ on a Debian base made here (podman.py). Each pod
spec is the one KubernetesPodOperator renders for the task, from the DAG file parsed under the cluster profile
(test_retrain_pod.py and test_tune_pods.py check the same renderings on the YAML); `podman kube play` runs it:
its Secrets (made with `podman secret create`), its claims (podman volumes of the claims' names: the shared
volume bound to a folder that holds a DVC-versioned training set, and the checkpoint claim), its security
context (uid, read-only root), and its own name through the downward API. No XCom sidecar: each pod records
its result in the pod results table of the promotion history's PostgreSQL database (core/pod_results.py),
read back with the operator's own call. MLflow is a real tracking server on this machine with basic auth and
proxied artifacts (`--serve-artifacts`), so the pods upload models over HTTP with no storage credentials.
(MLflow's basic auth needs its `auth` extra, which the lock does not carry; the Secret's values are checked in
the container's environment instead.)

Played, in order: the retrain DAG's train pod and its step pods up to a champion; the tuning DAG's study
start, one trial and finish; the scoring Deployment's pod serving that champion (changes listed above
SCORING_MANIFEST); the monitoring DAG's check pod on the day it logged.

What a pod spec is changed in before it is played, and why (it is checked on the YAML instead, by
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
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from core import pod_results
from core.settings import Settings, get_settings
from orchestration import k8s_contract as contract
from tests.conftest import free_port, wait_for
from tests.integration import podman
from tests.integration.conftest import REPO
from tests.integration.training_sets import AS_OF, versioned_training_set

pytestmark = pytest.mark.integration

IMAGE = podman.PROJECT_IMAGES["training_image"][1]
RETRAIN_DAG, TUNE_DAG, MONITOR_DAG = "retrain_fraud_model", "tune_fraud_model", "monitor_fraud_model"
APPROVE_DAG = "approve_fraud_model"
RUN_ID = "manual__2026-03-02T00:00:00+00:00"
TRIGGERED_BY = "admin"
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
    _, cluster_settings = _render("train", env, {"training_set": _training_set("unused")})
    secret_name = cluster_settings.training.credentials_secret
    # The promoter's Secret (the pods that write the promotion history): here the same login as the trainer's
    # (tests/integration/test_ledger_identities.py refuses the trainer's on a login without the grant).
    promoter_secret = cluster_settings.training.promotion_credentials_secret
    values = {**SECRET_VALUES, "MLOPS_CLUSTER__POSTGRES_DSN": ledger_dsn}
    claims = {contract.DATA_CLAIM: settings.home, cluster_settings.training.checkpoint_claim: checkpoints}
    cleanup = [
        ["secret", "rm", secret_name],
        ["secret", "rm", promoter_secret],
        *(["volume", "rm", "--force", claim] for claim in claims),
    ]
    for args in cleanup:
        podman.run(args)
    pods: list[str] = []
    try:
        for claim, folder in claims.items():
            bind = ["--opt", "type=none", "--opt", "o=bind", "--opt", f"device={folder}"]
            done = podman.run(["volume", "create", *bind, claim])
            assert done.returncode == 0, done.stderr
        _create_secret(work, secret_name, values)  # read by `envFrom: secretRef`
        _create_secret(work, promoter_secret, values)
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


def _training_set(rev: str) -> dict[str, object]:
    """The training_set task's XCom (its revision and how long it took to build)."""
    return {"training_set_rev": rev, "seconds": 1.5}


class AnsweringTaskInstance:
    """Answers the XComs a pod task's templates pull with what the upstream tasks (played before) returned."""

    def __init__(self, answers: dict[str, object]) -> None:
        self.answers = answers

    def xcom_pull(self, task_ids: str) -> object:
        assert task_ids in self.answers, f"no answer for {task_ids}'s XCom"
        return self.answers[task_ids]


def _render(
    task_id: str,
    env: dict[str, str],
    answers: dict[str, object],
    dag_id: str = RETRAIN_DAG,
    map_index: int = 0,
    params: dict[str, object] | None = None,
) -> tuple[dict, Settings]:
    """The pod of `dag_id`'s task `task_id` as the operator renders it when the DAG file is parsed under the
    cluster profile with `env`: templates rendered with the DAG's params at their defaults and the upstream
    XComs `answers` (the DAG's params at their defaults but those in `params`), then the operator's own pod
    builder (a mapped task: its `map_index`-th expansion)."""
    from airflow.dag_processing.dagbag import DagBag
    from kubernetes.client import ApiClient

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("MLOPS_PROFILE", "cluster")
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        try:
            bag = DagBag(dag_folder=str(REPO / "dags" / f"{dag_id}.py"))
            settings = get_settings()
        finally:
            get_settings.cache_clear()
    assert bag.import_errors == {} and bag.captured_warnings == {}
    dag = bag.dags[dag_id]
    task = dag.get_task(task_id)
    if hasattr(task, "expand_input"):  # a mapped task: one expansion, as the scheduler makes it
        task = task.unmap({"arguments": task.expand_input.value["arguments"][map_index]})
    task.render_template_fields(
        {
            "ti": AnsweringTaskInstance(answers),
            "dag": dag,
            "run_id": RUN_ID,
            "dag_run": SimpleNamespace(triggering_user_name=TRIGGERED_BY),
            "params": {**{name: dag.params[name] for name in dag.params}, **(params or {})},
        }
    )
    return ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True)), settings


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
    pod, _ = _render("train", cluster["env"], {"training_set": _training_set(cluster["rev"])})
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
    rendered with the XComs its upstream pods returned. The run asks for a sign-off (`require_approval`), so
    the gate's pass waits for a person and `compress` skips (exit 99: no variants for a version not
    promoted); then the approval DAG's `record_decision` pod records risk-officer's Approve, which promotes
    the version and makes its variants."""
    from core.errors import EXIT_SKIPPED

    assert played["result"], played["logs"][-4000:]
    run_id = played["result"]["run_id"]
    outcomes: dict[str, dict] = {}
    version = ""
    decision = ""
    for step in ("evaluate", "register", "promote", "export", "compress", "record_decision"):
        answers = {
            "training_set": _training_set(cluster["rev"]),
            "train": {"run_id": run_id, "image_id": played["image_id"]},
            "register": {"model_version": version},
            "promote": {"decision": decision},
            "answer": {
                "version": version, "choice": "Approve", "decided_by": "risk-officer",
                "comment": "figures checked", "started_by": TRIGGERED_BY,
            },
        }  # fmt: skip
        if step == "record_decision":
            pod, _ = _render(step, cluster["env"], answers, dag_id=APPROVE_DAG)
        else:
            pod, _ = _render(step, cluster["env"], answers, params={"require_approval": True})
        outcomes[step] = _play(cluster, pod)
        expected = str(EXIT_SKIPPED) if step == "compress" else "0"
        assert outcomes[step]["exit"] == expected, f"{step}:\n{outcomes[step]['logs'][-6000:]}"
        if step == "register":
            version = str(outcomes[step]["result"]["model_version"])
        if step == "promote":
            decision = outcomes[step]["result"]["decision"]
    return outcomes


@pytest.fixture(scope="module")
def identical_played(cluster, played, steps_played):
    """The retrain DAG's skip_identical pod, rendered as train's was, once the version it trained exists."""
    pod, _ = _render("skip_identical", cluster["env"], {"training_set": _training_set(cluster["rev"])})
    return _play(cluster, pod)


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
    assert decision["decision"] == "awaiting_approval", decision  # a pass, which the run asked a person for
    approved = steps_played["record_decision"]["result"]
    assert approved["decision"] == "promoted", approved
    assert approved["decided_by"] == "risk-officer" and str(approved["champion_version"]) == version
    # the export made fp32 alone; compress skipped the unpromoted pass; the approval made the variants
    assert [row["variant"] for row in steps_played["export"]["result"]["variants"]] == ["fp32"]
    assert steps_played["compress"]["result"]["compressed"] is False
    serving_file = approved["serving_file"]
    assert serving_file and "compress_error" not in approved, approved
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


def test_a_retrain_identical_to_the_registered_version_skips_in_its_pod(identical_played, steps_played):
    """Same training set, image (its commit) and configuration as the version the train pod made: the pod
    exits 99, which the task's `skip_on_exit_code` turns into a skip of train and the steps after it."""
    from core.errors import EXIT_SKIPPED

    version = str(steps_played["register"]["result"]["model_version"])
    assert identical_played["exit"] == str(EXIT_SKIPPED), identical_played["logs"][-4000:]
    result = identical_played["result"]
    assert result["identical"] is True and f"v{version}" in result["reason"], result
    args = identical_played["pod"]["spec"]["containers"][0]["args"]
    assert args[0] == "identical" and "--no-force" in args


# The tuning DAG's pods: the study's start, a trial (a GPU pod: podman ignores the GPU request and the trial
# trains on the CPU), the study's finish. One trial of two epochs: what is played is the pods, not a search.
TUNING_ENV = {"MLOPS_TUNING__TRIALS": "1", "MLOPS_TUNING__EPOCHS": "2", "MLOPS_TUNING__PARALLELISM": "1"}


@pytest.fixture(scope="module")
def tuning_played(cluster):
    env = {**cluster["env"], **TUNING_ENV}
    outcomes: dict[str, dict] = {}
    answers: dict[str, object] = {
        "as_of_date": AS_OF.isoformat(),
        "training_set": _training_set(cluster["rev"]),
    }
    for task_id in ("start_study", "trial", "finish_study"):
        pod, _ = _render(task_id, env, answers, dag_id=TUNE_DAG)
        outcomes[task_id] = _play(cluster, pod)
        assert outcomes[task_id]["exit"] == "0", f"{task_id}:\n{outcomes[task_id]['logs'][-6000:]}"
        if task_id == "start_study":
            answers["start_study"] = outcomes[task_id]["result"]
    return outcomes


def test_a_tuning_study_runs_as_pods_of_the_training_image_start_trial_and_finish(tuning_played, cluster):
    from mlflow import MlflowClient

    start, trial, finish = (tuning_played[t] for t in ("start_study", "trial", "finish_study"))
    study = start["result"]["study"]
    assert start["result"]["training_set_rev"] == cluster["rev"] and start["result"]["slots"] == [0]
    # The trial pod: the mapped task's expansion, restricted as every pod of the image, and trained.
    assert trial["pod"]["spec"]["containers"][0]["args"][:5] == ["trial", "--study", study, "--slot", "0"]
    assert trial["result"]["study"] == study and trial["result"]["state"] == "COMPLETE", trial["result"]
    assert trial["result"]["epochs"] == 2 and 0.0 <= trial["result"]["value"] <= 1.0
    inspect = trial["inspect"]
    assert inspect["Config"]["User"].split(":")[0] == str(contract.TRAINING_UID)
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    # Its checkpoints went to the claim, where its arguments point, written as 10001.
    written = [p for p in (cluster["checkpoints"] / "tuning").rglob("*") if p.is_file()]
    assert written and {p.stat().st_uid for p in written} == {contract.TRAINING_UID}
    # The finish pod read the study the trial pod wrote (PostgreSQL, the Secret's DSN) and recorded the best.
    assert finish["result"]["best_trial"] == trial["result"]["trial"]
    assert finish["result"]["best_validation_auc_pr"] == pytest.approx(trial["result"]["value"])
    client = MlflowClient(tracking_uri=cluster["url"])
    parent = client.get_run(start["result"]["parent_run_id"])
    assert parent.data.tags["lineage.training_set_rev"] == cluster["rev"]
    child = client.get_run(trial["result"]["mlflow_run_id"])
    assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id


# The scoring service: the Deployment of infra/k8s/base/serving played as its pod, with the image built from
# infra/docker/serving.Dockerfile. What is changed in the spec before it is played, and why:
# - the Deployment's pod template becomes a Pod (a Deployment's replica set is the API server's business);
# - the image is the one built here, taken as present (the manifest's Always would pull from a registry);
# - the tracking server's address is this machine's server, and the port a free one (the pod shares the
#   host's network, as the train pod does, to reach MLflow, Redis and PostgreSQL on 127.0.0.1, and the
#   container's declared port goes: podman would map it, which host networking refuses);
# - CPU and memory are capped to this machine (_podman_yaml);
# - the probes are taken out and polled here, as a kubelet would, on their own paths and port with the pod's
#   address as Host (podman runs an httpGet probe as curl inside the container, which the image does not
#   carry);
# - podman 4.3 cannot give an environment variable the pod's address (`fieldRef: status.podIP`): the value is
#   written in, the host's loopback that the pod shares; and it dereferences a secret volume's `optional`
#   without checking that it is set, so it is set to false, Kubernetes' default; and it ignores a mount's
#   `subPath`, mounting the whole claim there, so the claim's subPath mount (the scoring log's folder)
#   becomes a mount of that folder of the claim's (a hostPath volume).
SCORING_MANIFEST = REPO / "infra" / "k8s" / "base" / "serving" / "fraud-scoring.yaml"
SCORING_REDIS_DB = 12  # this module's Redis database (the online store the service writes through to)
SERVICE_HOST = "fraud-scoring.mlops-serving.svc"  # one of the Service's names: the Host a caller sends
SCORER_TOKEN = secrets.token_urlsafe(32)
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@pytest.fixture(scope="module")
def serving_image(request) -> tuple[str, str]:
    return podman.project_image("serving_image", request.session)


@pytest.fixture(scope="module")
def redis_db():
    import redis

    url = f"redis://127.0.0.1:6379/{SCORING_REDIS_DB}"
    client = redis.Redis.from_url(url)
    if client.dbsize():
        pytest.fail(f"Redis database {SCORING_REDIS_DB} is not empty; this module needs it to itself")
    yield url, client
    client.flushdb()
    client.close()


def _scoring_pod(image: str, tracking_uri: str, port: int, claim_folder: Path) -> tuple[dict, dict]:
    """The Deployment's pod, changed as the comment above says; and the probes taken out of it."""
    objects = [o for o in yaml.safe_load_all(SCORING_MANIFEST.read_text()) if o]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    template = deployment["spec"]["template"]
    metadata = {"name": deployment["metadata"]["name"], "namespace": deployment["metadata"]["namespace"]}
    metadata["labels"] = template["metadata"]["labels"]
    spec = json.loads(json.dumps(template["spec"]))
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    (container,) = pod["spec"]["containers"]
    probes = {name: container.pop(name) for name in PROBES}
    container["image"], container["imagePullPolicy"] = image, "IfNotPresent"
    env = {item["name"]: item for item in container["env"]}
    env["MLOPS_CLUSTER__MLFLOW_TRACKING_URI"]["value"] = tracking_uri
    env["MLOPS_SERVING__PORT"]["value"] = str(port)
    for item in container["env"]:
        if item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
            del item["valueFrom"]
            item["value"] = "127.0.0.1"
    for volume in pod["spec"]["volumes"]:
        if "secret" in volume:
            volume["secret"]["optional"] = False
    claims = {v["name"] for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v}
    for mount in container["volumeMounts"]:
        if mount["name"] in claims and "subPath" in mount:
            folder = mount.pop("subPath")
            mount["name"] = f"{mount['name']}-{folder}".replace("_", "-")
            source = {"path": str(claim_folder / folder), "type": "Directory"}
            pod["spec"]["volumes"].append({"name": mount["name"], "hostPath": source})
    command = container["command"]
    command[command.index("--port") + 1] = str(port)
    (container_port,) = container.pop("ports")  # podman maps a declared port, which host networking refuses
    assert container_port["containerPort"] == 8000 and container_port["name"] == "http"
    return _podman_yaml(pod, ""), probes


def _create_secret(work, name: str, values: dict[str, str], mounted: bool = False) -> None:
    """A Kubernetes Secret as podman 4.3 resolves one named in a spec: a podman secret of that name holding
    the Secret's `data` (key -> base64 value) as JSON where the spec reads it into the environment; where it
    mounts it as a volume, the whole Secret with its `data` values as they are, not base64-encoded (podman
    4.3 writes a `data` value into the file without decoding it, and reads no `stringData`)."""
    podman.run(["secret", "rm", name])
    secret_file = work / f"{name}.json"
    manifest = _secret_manifest(name, values)
    secret_file.write_text(json.dumps({**manifest, "data": values} if mounted else manifest["data"]))
    done = podman.run(["secret", "create", name, str(secret_file)])
    assert done.returncode == 0, done.stderr


def _get(url: str, host: str, token: str | None = None, body: object = None) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    headers = {"Host": host, **({"Authorization": f"Bearer {token}"} if token else {})}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"{}")
    except OSError:
        return 0, {}


@pytest.fixture(scope="module")
def scoring_played(cluster, steps_played, serving_image, redis_db):
    """The scoring pod up against the champion the step pods promoted, one transaction scored through it."""
    image, _ = serving_image
    redis_url, redis_client = redis_db
    home, work = cluster["settings"].home, cluster["work"]
    port = free_port()
    pod, probes = _scoring_pod(image, cluster["url"], port, home)
    name = pod["metadata"]["name"]
    (container,) = pod["spec"]["containers"]
    callers = {"callers": [{"name": "checkout", "roles": ["score"], "token": SCORER_TOKEN}]}
    secrets_made = {
        "mlops-feast-redis-url": {"url": redis_url},
        "mlops-mlflow-client": {"username": "scorer", "password": secrets.token_urlsafe(12)},
        "mlops-scoring-tokens": {"tokens.json": json.dumps(callers)},
        "mlops-pseudonym-key": {"key": secrets.token_hex(32)},
        # the promotion history the step pods wrote: the service serves the champion it records
        "fraud-scoring-ledger": {"url": cluster["secret"]["MLOPS_CLUSTER__POSTGRES_DSN"]},
    }
    mounted = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
    for secret, values in secrets_made.items():
        _create_secret(work, secret, values, mounted=secret in mounted)
    # What the operator prepares (infra/README.md, "Storage"): the scoring log's folder, owned by the
    # service's user (on a cluster, fsGroup 10001 makes the claim's files the pod's group).
    log_dir = home / "scoring_log"
    log_dir.mkdir(exist_ok=True)
    os.chown(log_dir, 10001, 10001)
    # What the features DAG leaves on the shared volume before a service starts: the Feast registry and its
    # feature_store.yaml, applied with the cluster settings the service runs with (the manifest's values) at
    # the volume's mount, here in a container of the serving image run as the volume's owner.
    plain = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    env_file = work / "features.env"
    plain["MLOPS_CLUSTER__REDIS_URL"] = redis_url
    env_file.write_text("".join(f"{key}={value}\n" for key, value in plain.items()))
    applied = podman.run(
        ["run", "--rm", "--network", "host", "--user", "0:0", "--env-file", str(env_file),
         "--volume", f"{contract.DATA_CLAIM}:{contract.DATA_MOUNT}", image,
         "python", "-c", "from core.settings import get_settings; from features.repo import apply; "
         "print(apply(get_settings()))"],
        timeout=600,
    )  # fmt: skip
    assert applied.returncode == 0, f"feast apply failed:\n{applied.stdout}\n{applied.stderr}"
    pod_file = work / "fraud-scoring.yaml"
    pod_file.write_text(yaml.safe_dump(pod))
    cluster["pods"].append(name)
    base = f"http://127.0.0.1:{port}"
    kubelet_host = f"127.0.0.1:{port}"  # a kubelet's probe sends the pod's address as Host
    try:
        done = podman.run(["kube", "play", "--network", "host", str(pod_file)], timeout=600)
        assert done.returncode == 0, f"podman kube play failed:\n{done.stdout}\n{done.stderr}"
        scorer = f"{name}-{container['name']}"

        def logs() -> str:
            out = podman.run(["logs", scorer])
            return (out.stdout + out.stderr)[-6000:]

        ready_path = probes["readinessProbe"]["httpGet"]["path"]

        def restarted() -> bool:  # the pod restarts a container that exits (restartPolicy Always)
            state = json.loads(podman.run(["inspect", scorer]).stdout or "[{}]")[0]
            return state.get("RestartCount", 0) > 0 or state.get("State", {}).get("Status") == "exited"

        try:
            wait_for(
                lambda: restarted() or _get(base + ready_path, kubelet_host)[0] == 200, 300, "the pod ready"
            )
        except TimeoutError as late:
            pytest.fail(f"{late}: {_get(base + ready_path, kubelet_host)}\n{logs()}")
        if restarted():
            pytest.fail(f"the scoring container exited:\n{logs()}")
        ready = _get(base + ready_path, kubelet_host)[1]
        live = _get(base + probes["livenessProbe"]["httpGet"]["path"], kubelet_host)
        now = datetime.now(UTC).replace(microsecond=0)
        txn = {
            "transaction_id": f"tx{secrets.token_hex(8)}", "customer_id": "c0000042",
            "merchant_id": "m000007", "amount": 42.5, "currency": "EUR", "country": "DE",
            "channel": "contactless", "merchant_category": "grocery",
            "event_timestamp": now.isoformat().replace("+00:00", "Z"),
        }  # fmt: skip
        refused_host = _get(base + "/score", kubelet_host, SCORER_TOKEN, txn)
        refused_token = _get(base + "/score", SERVICE_HOST, None, txn)
        scored = _get(base + "/score", SERVICE_HOST, SCORER_TOKEN, txn)
        assert scored[0] == 200, f"{scored}\n{logs()}"
        # The decision reaches the scoring log on the volume (flushed every LOG_FLUSH_INTERVAL_S) and the
        # customer's new state the online store (written through from a background thread).
        log_day = log_dir / f"date={now.date().isoformat()}"
        try:
            wait_for(lambda: any(log_day.rglob("*.parquet")), 60, f"the scoring log under {log_day}")
            wait_for(lambda: redis_client.dbsize() > 0, 60, "the service's write to the online store")
        except TimeoutError as late:
            pytest.fail(f"{late}; {sorted(map(str, log_dir.rglob('*')))}\n{logs()}")
        inspect = json.loads(podman.run(["inspect", scorer]).stdout)[0]
        yield {
            "pod": pod, "ready": ready, "live": live, "scored": scored, "txn": txn, "day": now.date(),
            "refused_host": refused_host, "refused_token": refused_token, "log_day": log_day,
            "inspect": inspect, "logs": logs(),
        }  # fmt: skip
    finally:
        podman.run(["pod", "rm", "--force", name])
        for secret in secrets_made:
            podman.run(["secret", "rm", secret])


def test_the_scoring_image_serves_the_champion_the_pods_promoted(scoring_played, steps_played):
    champion = str(steps_played["register"]["result"]["model_version"])
    assert scoring_played["ready"] == {"ready": True, "model": "fraud-detector", "version": champion}
    assert scoring_played["live"][0] == 200
    result = scoring_played["scored"][1]
    assert result["transaction_id"] == scoring_played["txn"]["transaction_id"]
    assert result["model"] == {"name": "fraud-detector", "version": champion}
    assert 0.0 <= result["score"] <= 1.0
    assert result["decision"] == ("decline" if result["score"] >= result["threshold"] else "approve")


def test_the_scoring_pod_takes_only_its_callers_on_its_service_names(scoring_played):
    assert scoring_played["refused_host"][0] == 400, scoring_played["refused_host"]
    assert scoring_played["refused_token"][0] == 401, scoring_played["refused_token"]


def test_the_scoring_pod_writes_only_its_log_as_10001_under_a_read_only_root(scoring_played):
    inspect = scoring_played["inspect"]
    assert inspect["Config"]["User"].split(":")[0] == "10001"
    assert inspect["HostConfig"]["ReadonlyRootfs"] is True
    mounts = {mount["Destination"]: mount for mount in inspect["Mounts"]}
    assert mounts[contract.DATA_MOUNT]["RW"] is False
    assert mounts[f"{contract.DATA_MOUNT}/scoring_log"]["RW"] is True
    written = [p for p in scoring_played["log_day"].rglob("*") if p.is_file()]
    assert written and {p.stat().st_uid for p in written} == {10001}


@pytest.fixture(scope="module")
def monitor_played(cluster, scoring_played):
    """The monitoring DAG's check pod, on the day the scoring pod logged."""
    pod, _ = _render("check", cluster["env"], {"dates_to_check": [scoring_played["day"].isoformat()]},
                     dag_id=MONITOR_DAG)  # fmt: skip
    return _play(cluster, pod)


def test_the_monitor_pod_checks_the_day_the_scoring_pod_logged(monitor_played, scoring_played, cluster):
    assert monitor_played["exit"] == "0", monitor_played["logs"][-6000:]
    assert monitor_played["pod"]["spec"]["containers"][0]["command"] == ["python", "-m", "monitoring"]
    (checked,) = monitor_played["result"]["checks"]
    assert checked["day"] == scoring_played["day"].isoformat()
    # Recorded in the results table of the cluster's PostgreSQL (the Secret's DSN), not on the volume.
    import sqlalchemy as sa

    engine = sa.create_engine(cluster["results_url"])
    with engine.connect() as conn:
        days = {row[0] for row in conn.exec_driver_sql("SELECT DISTINCT day FROM monitoring_results")}
    engine.dispose()
    assert days == {scoring_played["day"].isoformat()}
