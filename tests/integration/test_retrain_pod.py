"""The retrain DAG's `train` task as the cluster profile builds it, checked without a cluster.

The DAG file is parsed with MLOPS_PROFILE=cluster (it picks the operator at parse time), its `train` task's
templates are rendered with a stand-in task context, and the pod comes from the operator's own
`build_pod_request_obj`, so what is checked is what the worker would send to the API server: the Kubernetes
schema, Pod Security "restricted", each overlay's ResourceQuota and LimitRange, the settings it takes, the
Secret-only credentials, the checkpoint claim, the command line (parsed by the training CLI itself) and the
operator's flags. The overlays, kubernetes-validate and the shared checks come from conftest.py.
"""

from __future__ import annotations

import copy
import json
import re
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from core.errors import EXIT_SKIPPED
from core.settings import Settings, get_settings
from orchestration import k8s_contract as contract
from tests.integration.conftest import OVERLAYS, REPO, find, one, quota_and_limits, schema_errors

DAG_FILE = REPO / "dags" / "retrain_fraud_model.py"
DAG_ID = "retrain_fraud_model"
IMAGE = contract.training_image("registry.example.com", "0.1.0")
TRAINING_SET_REV = "9c4e2f1a"  # what the training_set task returns as `training_set_rev`
TRAINING_SET_SECONDS = 12.5  # and as `seconds` (how long it took: logged to the training run)
RUN_ID = "scheduled__2026-01-05T04:00:00+00:00"
SIDECAR = "airflow-xcom-sidecar"  # the provider's XCom sidecar container: not added (results: the database)
# Names and values that would mean a credential was written into the pod spec instead of read from a Secret.
SECRET_NAME = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|ACCESS_KEY|PRIVATE_KEY|API_KEY", re.I)
SECRET_VALUE = re.compile(r"://[^/@\s:]+:[^/@\s]+@|-----BEGIN|AKIA[0-9A-Z]{16}")


MLFLOW_RUN = "0f3a9c1d2e4b"  # what `train` returns as `run_id`
MODEL_VERSION = "7"  # what `register` returns as `model_version`
DECISION = "promoted"
# what `train` returns as `image_id`: the image its pod ran, as the node reported it
IMAGE_ID = "registry.example.com/mlops-fraud-training@sha256:" + "5e" * 32
PARAMS = {"as_of": "", "force": False}  # the retrain DAG's params of a run that set none
TRIGGERED_BY = "ml-engineer"  # the user who triggered the run (the gate records it: they may not approve)


class StandInTaskInstance:
    """Answers the XComs the pod tasks' templates pull."""

    def xcom_pull(self, task_ids: str) -> dict[str, str]:
        answers = {
            "training_set": {"training_set_rev": TRAINING_SET_REV, "seconds": TRAINING_SET_SECONDS},
            "train": {"run_id": MLFLOW_RUN, "image_id": IMAGE_ID},
            "register": {"model_version": MODEL_VERSION},
            "promote": {"decision": DECISION},
        }
        assert task_ids in answers, task_ids
        return answers[task_ids]


def parse_train_task(monkeypatch: pytest.MonkeyPatch, **env: str):
    """Parse the DAG file as the DAG processor would under the cluster profile; return its `train` task and
    the settings it was built from."""
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_TRAINING__IMAGE", IMAGE)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    assert bag.captured_warnings == {}  # the UI shows these as DAG warnings
    return bag.dags[DAG_ID].get_task("train"), get_settings()


def render_pod(task, **params: Any) -> dict[str, Any]:
    """The pod the worker would create: templates rendered (the DAG's params at their defaults, but those
    given), then the operator's own pod builder. Rendering replaces the task's templates: to render a task
    again, render copies (`copy.deepcopy`)."""
    from kubernetes.client import ApiClient

    dag_run = SimpleNamespace(triggering_user_name=TRIGGERED_BY)
    run_params = {**{name: task.params[name] for name in task.params}, **params}
    task.render_template_fields(
        {
            "ti": StandInTaskInstance(),
            "dag": task.dag,
            "run_id": RUN_ID,
            "dag_run": dag_run,
            "params": run_params,
        }
    )
    return ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))


@pytest.fixture(scope="module")
def built() -> tuple[Any, Settings, dict[str, Any]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        task, settings = parse_train_task(monkeypatch)
        return task, settings, render_pod(task)


@pytest.fixture
def task(built):
    return built[0]


@pytest.fixture
def settings(built) -> Settings:
    return built[1]


@pytest.fixture
def pod(built) -> dict[str, Any]:
    return copy.deepcopy(built[2])


def containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {container["name"]: container for container in pod["spec"]["containers"]}


def trainer(pod: dict[str, Any]) -> dict[str, Any]:
    return containers(pod)[contract.TRAINING_CONTAINER]


OWN_METADATA = {"metadata.name"}


def credentials_in_the_spec(pod: dict[str, Any], secret: str) -> list[str]:
    """Every way a container gets a credential other than `envFrom` of the named Secret. The pod's own name
    through the downward API (a `fieldRef` of its metadata) is not a credential."""
    found = []
    for name, container in containers(pod).items():
        for item in container.get("env") or []:
            if item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") in OWN_METADATA:
                continue
            if "valueFrom" in item:
                found.append(f"{name}: env {item['name']} comes from valueFrom, not envFrom")
            elif SECRET_NAME.search(item["name"]) or SECRET_VALUE.search(item.get("value") or ""):
                found.append(f"{name}: env {item['name']} carries a credential in the pod spec")
        for source in container.get("envFrom") or []:
            if source != {"secretRef": {"name": secret}}:
                found.append(f"{name}: envFrom {source}")
    return found


# --- the operator -----------------------------------------------------------------------------------------


def test_train_is_a_deferrable_pod_operator_that_reattaches_returns_its_result_and_cleans_up(task, settings):
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    assert isinstance(task, KubernetesPodOperator)
    # no XCom sidecar (and so no exec to read it): the result comes from the pod results table
    assert task.do_xcom_push is False
    assert task.on_finish_action.value == "delete_pod"
    assert task.durable is True
    assert task.reattach_on_restart is True
    assert task.deferrable is True
    assert task.startup_timeout_seconds == settings.training.startup_timeout_seconds
    assert task.execution_timeout == timedelta(minutes=settings.training.execution_timeout_minutes)
    assert task.retries >= 1
    assert task.upstream_task_ids == {"skip_identical"}


def test_the_pod_stops_by_itself_when_airflow_would_time_the_task_out(task, pod):
    assert pod["spec"]["activeDeadlineSeconds"] == task.execution_timeout.total_seconds()


def test_the_local_profile_runs_train_as_a_python_task_instead(monkeypatch):
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.delenv("MLOPS_PROFILE", raising=False)
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    assert not isinstance(bag.dags[DAG_ID].get_task("train"), KubernetesPodOperator)


def test_the_cluster_profile_trains_in_a_local_process_where_told_to(monkeypatch):
    """MLOPS_TRAINING__RUNNER=local: the cluster profile's services, training as a child process (a machine
    with no Kubernetes, like the cluster-profile chain test's)."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_TRAINING__RUNNER", "local")
    get_settings.cache_clear()
    bag = DagBag(dag_folder=str(DAG_FILE))
    assert bag.import_errors == {}
    train = bag.dags[DAG_ID].get_task("train")
    assert not isinstance(train, KubernetesPodOperator)
    assert train.upstream_task_ids == {"skip_identical"}


# --- what the API server checks ---------------------------------------------------------------------------


def test_the_pod_validates_strictly_against_the_kubernetes_schema(infra_tools, pod):
    assert schema_errors(infra_tools, [pod]) == []


def test_the_pod_passes_the_restricted_profile_with_every_container_hardened(pod):
    spec = pod["spec"]
    assert contract.restricted_profile_violations(spec) == []
    assert set(containers(pod)) == {contract.TRAINING_CONTAINER}  # no XCom sidecar
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    for name, container in containers(pod).items():
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["runAsNonRoot"] is True, name
    # The root filesystem is read-only, so the trainer's writable /tmp is an emptyDir.
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    (scratch,) = [mount for mount in trainer(pod)["volumeMounts"] if mount["mountPath"] == "/tmp"]
    assert "emptyDir" in volumes[scratch["name"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_fits_each_overlays_quota_and_limit_range(rendered, overlay, pod):
    quota, limit_items = quota_and_limits(rendered[overlay])
    assert contract.quota_fit_violations(pod["spec"], quota, limit_items) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_asking_for_more_gpus_than_the_quota_is_caught(monkeypatch, rendered, overlay):
    quota, limit_items = quota_and_limits(rendered[overlay])
    too_many = int(contract.parse_quantity(quota[f"requests.{contract.GPU_RESOURCE}"])) + 1
    task, _ = parse_train_task(monkeypatch, MLOPS_TRAINING__GPUS=str(too_many))
    spec = render_pod(task)["spec"]
    assert contract.restricted_profile_violations(spec) == []
    violations = contract.quota_fit_violations(spec, quota, limit_items)
    assert f"ResourceQuota requests.{contract.GPU_RESOURCE}: the pod needs {too_many}" in " | ".join(
        violations
    )


def test_asking_for_more_gpus_than_one_container_may_hold_is_caught(monkeypatch, rendered):
    quota, limit_items = quota_and_limits(rendered["prod"])
    container_max = next(item for item in limit_items if item["type"] == "Container")["max"]
    gpus = int(contract.parse_quantity(container_max[contract.GPU_RESOURCE])) + 1
    assert gpus <= int(contract.parse_quantity(quota[f"requests.{contract.GPU_RESOURCE}"]))
    task, _ = parse_train_task(monkeypatch, MLOPS_TRAINING__GPUS=str(gpus))
    violations = contract.quota_fit_violations(render_pod(task)["spec"], quota, limit_items)
    assert violations == [
        f"container {contract.TRAINING_CONTAINER}: requests.{contract.GPU_RESOURCE}={gpus}"
        f" exceeds LimitRange max {container_max[contract.GPU_RESOURCE]}",
        f"container {contract.TRAINING_CONTAINER}: limits.{contract.GPU_RESOURCE}={gpus}"
        f" exceeds LimitRange max {container_max[contract.GPU_RESOURCE]}",
    ]


# --- what it takes from the settings ----------------------------------------------------------------------


def test_the_pod_asks_for_the_settings_gpus_image_namespace_and_nodes(pod, settings):
    resources = trainer(pod)["resources"]
    gpus = str(settings.training.gpus)
    assert resources["requests"][contract.GPU_RESOURCE] == resources["limits"][contract.GPU_RESOURCE] == gpus
    assert trainer(pod)["image"] == settings.training.image == IMAGE
    assert (
        pod["metadata"]["namespace"] == settings.cluster.kubernetes_namespace == contract.TRAINING_NAMESPACE
    )
    assert pod["spec"]["nodeSelector"] == settings.training.node_selector
    assert pod["spec"]["tolerations"] == settings.training.tolerations
    # The network policy lets the trainer reach MLflow by this label.
    assert pod["metadata"]["labels"][contract.APP_LABEL] == contract.TRAINING_APP
    assert pod["spec"]["serviceAccountName"] == contract.TRAINING_SERVICE_ACCOUNT


def test_the_pod_follows_the_environment_at_parse_time(monkeypatch):
    tolerations = [{"key": "gpu-type", "operator": "Equal", "value": "h100", "effect": "NoSchedule"}]
    task, settings = parse_train_task(
        monkeypatch,
        MLOPS_TRAINING__NODE_SELECTOR='{"gpu-type": "h100"}',
        MLOPS_TRAINING__TOLERATIONS=json.dumps(tolerations),
        MLOPS_TRAINING__GPUS="2",
        MLOPS_TRAINING__IMAGE="registry.example.com/mlops-fraud-training:0.2.0",
        MLOPS_CLUSTER__KUBERNETES_NAMESPACE="mlops-training-canary",
        MLOPS_TRAINING__CREDENTIALS_SECRET="canary-credentials",
    )
    pod = render_pod(task)
    assert pod["spec"]["nodeSelector"] == {"gpu-type": "h100"}
    assert pod["spec"]["tolerations"] == tolerations
    assert trainer(pod)["resources"]["limits"][contract.GPU_RESOURCE] == "2"
    assert trainer(pod)["image"] == "registry.example.com/mlops-fraud-training:0.2.0"
    assert pod["metadata"]["namespace"] == "mlops-training-canary"
    assert trainer(pod)["envFrom"] == [{"secretRef": {"name": "canary-credentials"}}]
    assert credentials_in_the_spec(pod, settings.training.credentials_secret) == []


# --- credentials, checkpoints, command line ---------------------------------------------------------------


def test_credentials_come_only_from_the_secret_through_env_from(pod, settings):
    assert trainer(pod)["envFrom"] == [{"secretRef": {"name": settings.training.credentials_secret}}]
    assert SIDECAR not in containers(pod)
    assert credentials_in_the_spec(pod, settings.training.credentials_secret) == []


@pytest.mark.parametrize(
    ("env", "env_from", "found"),
    [
        ([{"name": "MLFLOW_TRACKING_PASSWORD", "value": "hunter2"}], None, "carries a credential"),
        ([{"name": "MLFLOW_TRACKING_URI", "value": "https://trainer:s3cr3t@mlflow:5000"}], None, "carries"),
        (
            [{"name": "AWS_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "k"}}}],
            None,
            "comes from valueFrom",
        ),
        (
            [{"name": "TOKEN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['token']"}}}],
            None,
            "comes from valueFrom",
        ),
        ([], [{"secretRef": {"name": "someone-elses-secret"}}], "envFrom"),
        ([], [{"configMapRef": {"name": "mlops-config"}}], "envFrom"),
    ],
)
def test_the_credentials_check_finds_a_credential_put_in_the_spec(pod, settings, env, env_from, found):
    trainer(pod)["env"] += env
    trainer(pod)["envFrom"] += env_from or []
    (problem,) = credentials_in_the_spec(pod, settings.training.credentials_secret)
    assert found in problem


def test_no_list_in_the_pod_holds_a_duplicate_even_when_the_pod_is_built_again(task, pod):
    from kubernetes.client import ApiClient

    again = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(dry_run=True))
    for built in (pod, again):
        volume_names = [volume["name"] for volume in built["spec"]["volumes"]]
        assert len(volume_names) == len(set(volume_names))
        for name, container in containers(built).items():
            for field, key in (("envFrom", None), ("env", "name"), ("volumeMounts", "mountPath")):
                items = [
                    json.dumps(i, sort_keys=True) if key is None else i[key] for i in container.get(field, [])
                ]
                assert len(items) == len(set(items)), f"{name}.{field}: {items}"
    assert again["spec"]["containers"] == pod["spec"]["containers"]
    assert again["spec"]["volumes"] == pod["spec"]["volumes"]


def test_the_checkpoint_claim_is_mounted_where_the_arguments_point(pod, settings):
    volumes = {volume["name"]: volume for volume in pod["spec"]["volumes"]}
    (mount,) = [m for m in trainer(pod)["volumeMounts"] if m["mountPath"] == "/checkpoints"]
    assert volumes[mount["name"]] == {
        "name": mount["name"],
        "persistentVolumeClaim": {"claimName": settings.training.checkpoint_claim},
    }
    assert not mount.get("readOnly")
    args = trainer(pod)["args"]
    assert args[args.index("--checkpoint-dir") + 1] == f"/checkpoints/{TRAINING_SET_REV}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_creates_the_claim_the_pod_mounts(rendered, overlay, pod, settings):
    objects = rendered[overlay]
    claim = one(
        objects, "PersistentVolumeClaim", settings.training.checkpoint_claim, contract.TRAINING_NAMESPACE
    )
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    size = contract.parse_quantity(claim["spec"]["resources"]["requests"]["storage"])
    assert size >= contract.parse_quantity("10Gi")
    # If the namespace's quota ever caps claims, this one must still fit.
    quota, _ = quota_and_limits(objects)
    claims = find(objects, "PersistentVolumeClaim", namespace=contract.TRAINING_NAMESPACE)
    if "persistentvolumeclaims" in quota:
        assert len(claims) <= int(contract.parse_quantity(quota["persistentvolumeclaims"]))
    if "requests.storage" in quota:
        total = sum(contract.parse_quantity(c["spec"]["resources"]["requests"]["storage"]) for c in claims)
        assert total <= contract.parse_quantity(quota["requests.storage"])


def test_the_container_runs_the_training_cli_with_rendered_arguments(pod):
    container = trainer(pod)
    assert container["command"] == ["python", "-m", "training"]
    assert container["args"] == [
        "train",
        "--training-set-rev",
        TRAINING_SET_REV,
        "--dag-id",
        DAG_ID,
        "--dag-run-id",
        RUN_ID,
        "--training-set-seconds",
        str(TRAINING_SET_SECONDS),
        "--checkpoint-dir",
        f"/checkpoints/{TRAINING_SET_REV}",
    ]
    # its own name, from the downward API: the key of the result it records
    identity = {e["name"]: e["valueFrom"]["fieldRef"] for e in container["env"] if "valueFrom" in e}
    assert identity == {"MLOPS_POD_NAME": {"fieldPath": "metadata.name"}}
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_training_cli_accepts_the_arguments_as_they_are(pod):
    """Parsed by the CLI's own option definitions (nothing runs), so a renamed option fails here."""
    import typer

    from training.cli import app

    subcommand, *arguments = trainer(pod)["args"]
    command = typer.main.get_command(app).commands[subcommand]
    with command.make_context(subcommand, arguments) as context:
        params = context.params
    assert params["training_set_rev"] == TRAINING_SET_REV
    assert params["dag_id"] == DAG_ID
    assert params["dag_run_id"] == RUN_ID
    assert params["training_set_seconds"] == TRAINING_SET_SECONDS
    assert params["checkpoint_dir"] == Path(f"/checkpoints/{TRAINING_SET_REV}")
    assert params["xcom_path"] is None


def test_before_rendering_the_arguments_are_templates_of_the_upstream_xcom(monkeypatch):
    task, _ = parse_train_task(monkeypatch)
    assert "arguments" in task.template_fields
    rev_template = "{{ ti.xcom_pull(task_ids='training_set')['training_set_rev'] }}"
    assert task.arguments[task.arguments.index("--training-set-rev") + 1] == rev_template
    assert f"/checkpoints/{rev_template}" in task.arguments


# --- the steps after training: CPU pods of the training image --------------------------------------------

STEP_ARGUMENTS = {
    "evaluate": ["evaluate", "--run-id", MLFLOW_RUN],
    "register": ["register", "--run-id", MLFLOW_RUN, "--image-id", IMAGE_ID],
    "promote": [
        "promote",
        "--version",
        MODEL_VERSION,
        "--dag-id",
        DAG_ID,
        "--dag-run-id",
        RUN_ID,
        "--triggered-by",
        TRIGGERED_BY,
        "--no-require-approval",
    ],
    "export": ["export", "--version", MODEL_VERSION],
    "compress": ["compress", "--version", MODEL_VERSION, "--decision", DECISION],
}


@pytest.fixture(scope="module")
def step_pods() -> dict[str, tuple[Any, dict[str, Any]]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        train, _ = parse_train_task(monkeypatch)
        return {
            step: (train.dag.get_task(step), render_pod(copy.deepcopy(train.dag.get_task(step))))
            for step in STEP_ARGUMENTS
        }


@pytest.mark.parametrize("step", list(STEP_ARGUMENTS))
def test_each_step_after_training_is_a_cpu_pod_of_the_training_image_running_the_training_cli(
    step_pods, step, settings
):
    """The Airflow image carries neither torch nor MLflow, so these cannot be Python tasks there."""
    import typer
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from training.cli import app

    task, pod = step_pods[step]
    assert isinstance(task, KubernetesPodOperator) and task.do_xcom_push is False
    container = trainer(pod)
    assert container["image"] == settings.training.image == IMAGE
    assert container["command"] == list(contract.TRAINING_COMMAND)
    assert container["args"] == STEP_ARGUMENTS[step]
    command = typer.main.get_command(app).commands[step]
    with command.make_context(step, container["args"][1:]):
        pass  # the CLI's own option definitions accept them
    for kind in ("requests", "limits"):
        assert contract.GPU_RESOURCE not in container["resources"][kind]
    assert not pod["spec"].get("nodeSelector") and not pod["spec"].get("tolerations")  # any node
    assert contract.restricted_profile_violations(pod["spec"]) == []
    # Separated duties: only the decision writes the promotion history, with the promoter's identity and
    # login; evaluate, register, export and compress run with the trainer's, which cannot move the champion.
    promoter = step in contract.LEDGER_STEPS
    secret = (
        settings.training.promotion_credentials_secret if promoter else settings.training.credentials_secret
    )
    account = contract.PROMOTER_SERVICE_ACCOUNT if promoter else contract.TRAINING_SERVICE_ACCOUNT
    assert trainer(pod)["envFrom"] == [{"secretRef": {"name": secret}}]
    assert pod["spec"]["serviceAccountName"] == account
    assert credentials_in_the_spec(pod, secret) == []
    assert (step == "promote") == promoter


def test_an_identical_retrain_is_skipped_by_a_cpu_pod_before_training(step_pods, settings):
    """`python -m training identical` exits EXIT_SKIPPED when a registered version has the same training
    set, commit, configuration and image: the pod task is skipped, and with it train and the steps after."""
    import typer

    from training.cli import app

    dag = step_pods["evaluate"][0].dag
    task = dag.get_task("skip_identical")
    assert task.upstream_task_ids == {"training_set"} and task.downstream_task_ids == {"train"}
    assert list(task.skip_on_exit_code) == [EXIT_SKIPPED]
    pod = render_pod(copy.deepcopy(task))
    container = trainer(pod)
    assert container["image"] == settings.training.image
    assert container["args"][:3] == ["identical", "--training-set-rev", TRAINING_SET_REV]
    command = typer.main.get_command(app).commands["identical"]
    with command.make_context("identical", container["args"][1:]) as context:
        assert context.params["dag_id"] == DAG_ID and context.params["dag_run_id"] == RUN_ID
        assert context.params["force"] is False
    # a manual run's `force` param reaches the pod: it trains anyway
    forced = trainer(render_pod(copy.deepcopy(task), force=True))["args"]
    with command.make_context("identical", forced[1:]) as context:
        assert context.params["force"] is True
    assert contract.GPU_RESOURCE not in container["resources"]["limits"]
    assert contract.restricted_profile_violations(pod["spec"]) == []


def test_the_step_pods_chain_after_train_and_publish_the_model_asset(step_pods):
    from orchestration.assets import FRAUD_MODEL

    dag = step_pods["evaluate"][0].dag
    assert dag.get_task("evaluate").upstream_task_ids == {"train"}
    assert dag.get_task("register").upstream_task_ids == {"evaluate"}
    assert dag.get_task("promote").upstream_task_ids == {"register"}
    assert dag.get_task("export").upstream_task_ids == {"promote"}
    # the variants after the decision, for a promoted version only: the pod exits 99 otherwise, a skip
    compress = dag.get_task("compress")
    assert compress.upstream_task_ids == {"export"} and list(compress.skip_on_exit_code) == [EXIT_SKIPPED]
    publish = dag.get_task("publish_model")
    assert publish.upstream_task_ids == {"register", "promote", "export"}
    assert [outlet.name for outlet in publish.outlets] == [FRAUD_MODEL.name]


def test_the_step_pods_validate_and_fit_each_overlay(infra_tools, rendered, step_pods):
    pods = [pod for _, pod in step_pods.values()]
    assert schema_errors(infra_tools, pods) == []
    for overlay in OVERLAYS:
        quota, limit_items = quota_and_limits(rendered[overlay])
        for pod in pods:
            assert contract.quota_fit_violations(pod["spec"], quota, limit_items) == [], overlay


def test_every_pod_mounts_the_shared_volume_read_only_at_mlops_home(pod, step_pods):
    for each in [pod, *(p for _, p in step_pods.values())]:
        volumes = {volume["name"]: volume for volume in each["spec"]["volumes"]}
        (mount,) = [m for m in trainer(each)["volumeMounts"] if m["mountPath"] == contract.DATA_MOUNT]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["persistentVolumeClaim"] == {
            "claimName": contract.DATA_CLAIM,
            "readOnly": True,
        }
        env = {item["name"]: item.get("value") for item in trainer(each)["env"]}
        assert env["MLOPS_HOME"] == contract.DATA_MOUNT
        assert env["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] == "false"


def test_the_pods_get_the_launching_tasks_settings_written_out(monkeypatch):
    """A setting the Airflow side changed reaches the pod explicitly, not the image's default."""
    task, _ = parse_train_task(
        monkeypatch,
        MLOPS_TRAINING__EPOCHS="4",
        MLOPS_GATE__MARGIN="0.02",
        MLOPS_CLUSTER__MLFLOW_TRACKING_URI="http://mlflow.example:5000",
    )
    env = {item["name"]: item.get("value") for item in trainer(render_pod(task))["env"]}
    assert env["MLOPS_TRAINING__EPOCHS"] == "4"
    assert env["MLOPS_GATE__MARGIN"] == "0.02"
    assert env["MLOPS_CLUSTER__MLFLOW_TRACKING_URI"] == "http://mlflow.example:5000"
    for secret in ("MLOPS_CLUSTER__POSTGRES_DSN", "MLOPS_CLUSTER__REDIS_URL"):
        assert secret not in env  # from the Secret only


def test_more_than_one_gpu_runs_under_torchrun(monkeypatch):
    task, _ = parse_train_task(monkeypatch, MLOPS_TRAINING__GPUS="2")
    container = trainer(render_pod(task))
    assert container["command"] == ["torchrun", "--standalone", "--nproc-per-node=2", "--module", "training"]
    assert container["args"][0] == "train"


def test_a_runs_require_approval_param_reaches_the_gate_pod(step_pods):
    """The `require_approval` param of a manual run asks the gate for a sign-off (approval.enabled off)."""
    import typer

    from training.cli import app

    task = step_pods["promote"][0]
    command = typer.main.get_command(app).commands["promote"]
    for asked in (False, True):
        args = trainer(render_pod(copy.deepcopy(task), require_approval=asked))["args"]
        with command.make_context("promote", args[1:]) as context:
            assert context.params["require_approval"] is asked


def test_the_deferred_wait_reaches_the_api_server_from_inside_the_cluster(task, monkeypatch, tmp_path):
    """The trigger the operator defers to, serialized and rebuilt as the triggerer does, loads the in-cluster
    configuration (the triggerer pod's service account). The triggerer has no kubeconfig and no
    `kubernetes_default` connection: without in_cluster its hook looks for ~/.kube/config and fails."""
    import asyncio
    import importlib

    import kubernetes_asyncio.config.incluster_config as incluster
    from airflow.sdk.exceptions import TaskDeferred
    from kubernetes_asyncio.client import Configuration

    # What a pod's service account gives it: the API server's address and the mounted token and CA.
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("service-account-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config

    deferring = copy.deepcopy(task)
    deferring.pod = deferring.build_pod_request_obj(dry_run=True)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.invoke_defer_method()
    classpath, kwargs = deferred.value.trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    trigger = getattr(importlib.import_module(module), name)(**kwargs)  # as the triggerer rebuilds it

    hook = trigger.hook
    hook.client_configuration = Configuration()
    asyncio.run(hook._load_config())
    assert hook._is_in_cluster is True
    assert hook.client_configuration.host == "https://10.96.0.1:443"
    assert hook.client_configuration.api_key["BearerToken"] == "Bearer service-account-token"


class RecordingTaskInstance:
    """A task instance that keeps what is pushed to XCom."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, Any]] = []

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed.append((key, value))


def test_the_task_returns_what_its_pod_recorded_once_and_the_row_is_deleted(
    task, postgres_database, monkeypatch
):
    """No sidecar, no exec: in the pod, the training CLI's emit records the result under the pod's own name
    (the downward API's) and namespace; the operator, once that pod has succeeded, reads the result of the
    pod it followed, pushes it as the task's return value (the runner does not: do_xcom_push is off) and
    deletes the row. Another pod's result is never taken: a pod that recorded nothing fails the task, which
    names it."""
    from kubernetes.client import models as k8s

    from core import pod_results

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_CLUSTER__POSTGRES_DSN", postgres_database.replace("+psycopg2", ""))
    get_settings.cache_clear()
    namespace = get_settings().cluster.kubernetes_namespace
    trained = {"run_id": MLFLOW_RUN, "status": "trained", "training_set_rev": TRAINING_SET_REV}
    # in the pod: the CLI's last step
    monkeypatch.setenv(pod_results.POD_NAME_ENV, "fraud-train-7fk2x9")
    pod_results.emit(trained)
    monkeypatch.setenv(pod_results.POD_NAME_ENV, "fraud-train-other1")
    pod_results.emit({"run_id": "another pod's run", "status": "trained"})
    monkeypatch.delenv(pod_results.POD_NAME_ENV)

    followed = copy.deepcopy(task)
    ran = k8s.V1ContainerStatus(
        name=contract.TRAINING_CONTAINER, image=IMAGE, image_id=IMAGE_ID, ready=False, restart_count=0
    )
    followed.pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="fraud-train-7fk2x9", namespace=namespace),
        status=k8s.V1PodStatus(phase="Succeeded", container_statuses=[ran]),
    )
    ti = RecordingTaskInstance()
    # with the image the node ran, by digest, for the model's lineage (register's --image-id)
    returned = {**trained, "image_id": IMAGE_ID}
    assert followed.pod_result({"ti": ti}) == returned
    # the deferral found the pod already done and returned through trigger_reentry: read and pushed once
    assert followed.pod_result({"ti": ti}) == returned
    assert ti.pushed == [("return_value", returned)]
    with pytest.raises(pod_results.PodResultMissingError, match=f"{namespace}/fraud-train-7fk2x9"):
        pod_results.read(get_settings().promotion_ledger_url, namespace, "fraud-train-7fk2x9")  # deleted

    retried = copy.deepcopy(task)  # a retry's new pod, which failed before recording anything
    retried.pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="fraud-train-q8w2m1", namespace=namespace))
    with pytest.raises(pod_results.PodResultMissingError, match="fraud-train-q8w2m1 finished without"):
        retried.pod_result({"ti": RecordingTaskInstance()})
    get_settings.cache_clear()


def test_a_pods_lineage_events_come_back_with_its_result_and_its_task_writes_them(
    task, postgres_database, monkeypatch
):
    """A pod mounts the shared filesystem read-only: the OpenLineage events of its step are kept in the pod
    and recorded with its result; the task that followed it writes them under $MLOPS_HOME/lineage and
    pushes the result without them."""
    from kubernetes.client import models as k8s

    from core import lineage, pod_results

    monkeypatch.setenv("MLOPS_PROFILE", "cluster")
    monkeypatch.setenv("MLOPS_CLUSTER__POSTGRES_DSN", postgres_database.replace("+psycopg2", ""))
    get_settings.cache_clear()
    settings = get_settings()
    run = lineage.mlflow(settings, f"runs/{MLFLOW_RUN}")

    @lineage.emits("register", lambda s, result: lineage.Datasets([run], []))
    def step(s) -> dict:
        return {"run_id": MLFLOW_RUN, "model_version": "3"}

    monkeypatch.setenv(pod_results.POD_NAME_ENV, "fraud-register-5hq2p")  # in the pod
    pod_results.emit(step(settings))
    assert lineage.read_events(settings, (lineage.START, lineage.COMPLETE)) == []  # nothing written there
    monkeypatch.delenv(pod_results.POD_NAME_ENV)

    followed = copy.deepcopy(task)
    followed.pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(
            name="fraud-register-5hq2p", namespace=settings.cluster.kubernetes_namespace
        ),
        status=k8s.V1PodStatus(phase="Succeeded"),
    )
    ti = RecordingTaskInstance()
    assert followed.pod_result({"ti": ti}) == {"run_id": MLFLOW_RUN, "model_version": "3"}
    assert ti.pushed == [("return_value", {"run_id": MLFLOW_RUN, "model_version": "3"})]
    start, complete = lineage.read_events(settings, (lineage.START, lineage.COMPLETE))
    assert (start["eventType"], complete["eventType"]) == ("START", "COMPLETE")
    assert complete["job"]["name"] == "register" and complete["inputs"][0]["name"] == f"runs/{MLFLOW_RUN}"
    assert complete["run"]["facets"]["mlops"]["model_version"] == "3"
    get_settings.cache_clear()


def test_the_approval_and_the_monitors_rollback_run_as_the_promoter_and_nothing_else_does(settings):
    """The approval DAG's `approve` pod and the monitoring DAG's `check` pod (its rollback) write the
    promotion history: the promoter's identity and login. The train pod, like every step but these, has the
    trainer's."""
    from airflow.sdk import DAG

    from orchestration.tasks import monitor_pod_operator
    from orchestration.training_task import step_pod_operator

    with DAG("separated_duties", schedule=None):
        approve = step_pod_operator(settings, "approve", ["--version", "3", "--choice", "Approve"])
        check = monitor_pod_operator(settings, "2026-01-08")
    for task in (approve, check):
        pod = render_pod(task)
        assert pod["spec"]["serviceAccountName"] == contract.PROMOTER_SERVICE_ACCOUNT, task.task_id
        secret = settings.training.promotion_credentials_secret
        assert trainer(pod)["envFrom"] == [{"secretRef": {"name": secret}}], task.task_id
        assert credentials_in_the_spec(pod, secret) == []
    assert settings.training.promotion_credentials_secret != settings.training.credentials_secret
