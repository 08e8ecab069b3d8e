"""The Airflow image, built and run for real, without Docker or a cluster.

infra/docker/airflow.Dockerfile is built with podman on the Debian base made here (podman.py), the same file a
release builds on the official apache/airflow image. Each check runs the image with `podman run --rm` as an
Airflow task pod would run it: the Helm values' environment (test_infra_helm.pod_environment: the cluster
profile, MLOPS_HOME=/mlops, placeholder Secrets), a writable folder mounted at the shared volume's mount
(k8s_contract.DATA_MOUNT), the image's own user, and no network, so nothing it does can lean on a service.

What is checked: the baked DAGs parse with no import error and the retrain DAG's training steps are pod
operators; every Python task's callable imports in the image, with what its body imports (a task that
imported torch or MLflow would parse fine and fail only when it runs); two tasks run for real through
`airflow tasks test` (the landing one writes to the shared volume exactly what this checkout writes); and the
image is what it says: its commit, UID 50000 in group 0, a working JVM for Spark, and no torch or MLflow.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from datetime import date
from pathlib import Path

import pytest

from core.settings import Settings
from orchestration import k8s_contract as contract
from tests.integration import podman
from tests.integration.test_infra_helm import VALUES, pod_environment

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
IMAGE = podman.PROJECT_IMAGES["airflow_image"][1]
TRAINING_IMAGE = podman.PROJECT_IMAGES["training_image"][1]
DAGS_FOLDER = "/opt/airflow/dags"
AIRFLOW_UID = 50000
DAG_IDS = {
    "approve_fraud_model",
    "ingest_transactions",
    "build_features",
    "retrain_fraud_model",
    "monitor_fraud_model",
    "synthetic_landing",
    "tune_fraud_model",
    "enforce_retention",
    "score_fraud_batch",
    "erase_customer",
    "reproduce_fraud_model",
}
# The retrain DAG's steps that run in the training image, each its own pod, under the cluster profile.
POD_STEPS = {"skip_identical", "train", "evaluate", "register", "promote", "export", "compress"}
# The only Airflow-image tasks that use the training package, with what each imports from it: they build the
# training set and its per-date feature rows (no torch, no MLflow).
TRAINING_PACKAGE_TASKS = {
    ("retrain_fraud_model", "training_set"): "training.dataset.build_training_set",
    ("tune_fraud_model", "training_set"): "training.dataset.build_training_set",
    ("build_features", "build_training_rows"): "training.feature_rows.build_feature_rows",
}
# Not in this image (the training image has them): importing one in an Airflow task would fail at run time.
TRAINING_ONLY = ("torch", "mlflow", "onnx", "onnxruntime", "sklearn")
FIRST_PARTY = ("core", "pipelines", "features", "training", "orchestration", "mlops")
# The metadata database of `airflow tasks test`: SQLite on a folder of its own (the chart's is PostgreSQL).
DB_MOUNT = "/airflow-db"

# Run inside the image: parse the DAG folder as the DAG processor does, then, for every task, import what it
# runs: a Python task's callable and every module its source imports (nested functions included), and for
# an operator class of this project, what its methods import. One JSON line on stdout.
DAG_PROBE = r"""
import ast, importlib, inspect, json, sys, textwrap
from airflow.dag_processing.dagbag import DagBag

FIRST_PARTY = set(sys.argv[2].split(","))


def imported_names(source):
    found = []
    for node in ast.walk(ast.parse(textwrap.dedent(source))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def import_all(names):
    errors = {}
    for module, name in names:
        what = module if name is None else f"{module}.{name}"
        try:
            loaded = importlib.import_module(module)
            if name is not None and name != "*" and not hasattr(loaded, name):
                importlib.import_module(what)  # `from package import submodule`
        except BaseException as exc:
            errors[what] = f"{type(exc).__name__}: {exc}"
    return errors


bag = DagBag(dag_folder=sys.argv[1])
report = {
    "import_errors": {path: str(error) for path, error in bag.import_errors.items()},
    "warnings": {path: [str(w) for w in found] for path, found in bag.captured_warnings.items()},
    "dags": {},
}
for dag_id, dag in sorted(bag.dags.items()):
    tasks = report["dags"][dag_id] = {}
    for task in dag.tasks:
        # a mapped task stands for instances of its operator class (a pod operator, a Python task)
        kind = getattr(task, "operator_class", None)
        kind = kind if isinstance(kind, type) else type(task)
        entry = tasks[task.task_id] = {
            "operator": kind.__name__,
            "bases": [c.__name__ for c in kind.__mro__],
            "imports": [],
            "errors": {},
        }
        function = getattr(task, "python_callable", None)
        if function is None:
            function = (getattr(task, "partial_kwargs", None) or {}).get("python_callable")
        sources = []
        if function is not None:
            entry["callable"] = function.__qualname__
            entry["callable_module_loaded"] = function.__module__ in sys.modules
            sources.append(inspect.getsource(function))
        if kind.__module__.split(".")[0] in FIRST_PARTY:
            # Method by method: a class made inside a function has no class source to find.
            sources += [inspect.getsource(m) for m in vars(kind).values() if inspect.isfunction(m)]
        names = sorted({pair for source in sources for pair in imported_names(source)}, key=str)
        entry["imports"] = [m if n is None else f"{m}.{n}" for m, n in names]
        entry["errors"] = import_all(names)
report["training_only_loaded"] = sorted(
    m for m in sys.argv[3].split(",") if m in sys.modules
)
print("REPORT " + json.dumps(report))
"""

# Run inside the image with its own environment only (no pod variables): who it runs as, what it carries.
IDENTITY_PROBE = r"""
import grp, importlib.util, json, os, pwd, shutil, subprocess, sys

from core.settings import get_settings

java = subprocess.run(["java", "-version"], capture_output=True, text=True)
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[1]").appName("image-probe")
    .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false").getOrCreate()
)
rows = spark.range(10).selectExpr("sum(id) AS total").collect()[0]["total"]
spark.stop()
settings = get_settings()
print("REPORT " + json.dumps({
    "uid": os.getuid(),
    "gid": os.getgid(),
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "group": grp.getgrgid(os.getgid()).gr_name,
    "commit": os.environ.get("MLOPS_GIT_COMMIT"),
    "java_exit": java.returncode,
    "java": java.stderr,
    "spark_sum": rows,
    "python": sys.executable,
    "version": list(sys.version_info[:2]),
    "airflow": shutil.which("airflow"),
    "airflow_home": os.environ.get("AIRFLOW_HOME"),
    "cwd": os.getcwd(),
    "profile": str(settings.profile),
    "home": str(settings.home),
    "pickle": os.environ.get("MLFLOW_ALLOW_PICKLE_DESERIALIZATION"),
    "missing": {m: importlib.util.find_spec(m) is None for m in sys.argv[1].split(",")},
    "present": {m: importlib.util.find_spec(m) is not None for m in sys.argv[2].split(",")},
}))
"""


def _report(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
    return json.loads(line.removeprefix("REPORT "))


def _shared_folder(path: Path) -> Path:
    """A folder as the pod sees its volume: group 0 may write it (the chart's fsGroup 0), others nothing."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o770)
    return path


@pytest.fixture(scope="module")
def airflow_image(request) -> tuple[str, str]:
    return podman.project_image("airflow_image", request.session)


@pytest.fixture(scope="module")
def shared_home(tmp_path_factory) -> Path:
    """The shared volume, mounted at k8s_contract.DATA_MOUNT in the container."""
    return _shared_folder(tmp_path_factory.mktemp("shared") / "mlops")


def pod_env() -> dict[str, str]:
    """What an Airflow task pod gets from the Helm values, with the training image of these tests."""
    env = pod_environment(VALUES)
    assert env["MLOPS_PROFILE"] == "cluster" and env["MLOPS_HOME"] == contract.DATA_MOUNT
    return {**env, "MLOPS_TRAINING__IMAGE": TRAINING_IMAGE}


def in_pod(
    image: str,
    home: Path,
    command: list[str],
    env: dict[str, str] | None = None,
    volumes: tuple[str, ...] = (),
    timeout: float = 600,
) -> subprocess.CompletedProcess:
    """`podman run --rm` of the image with a task pod's environment and the shared volume, no network."""
    args = ["run", "--rm", "--network=none", f"--volume={home}:{contract.DATA_MOUNT}"]
    args += [f"--volume={volume}" for volume in volumes]
    args += [f"--env={name}={value}" for name, value in {**pod_env(), **(env or {})}.items()]
    return podman.run([*args, image, *command], timeout=timeout)


@pytest.fixture(scope="module")
def dag_report(airflow_image, shared_home) -> dict:
    image, _ = airflow_image
    done = in_pod(
        image,
        shared_home,
        ["python", "-c", DAG_PROBE, DAGS_FOLDER, ",".join(FIRST_PARTY), ",".join(TRAINING_ONLY)],
    )
    return _report(done)


@pytest.fixture(scope="module")
def airflow_db(airflow_image, shared_home, tmp_path_factory) -> tuple[str, dict[str, str]]:
    """A migrated SQLite metadata database for `airflow tasks test`, on a folder mounted into each run."""
    image, _ = airflow_image
    folder = _shared_folder(tmp_path_factory.mktemp("airflow-db") / "db")
    volume = f"{folder}:{DB_MOUNT}"
    env = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{DB_MOUNT}/airflow.db"}
    done = in_pod(image, shared_home, ["airflow", "db", "migrate"], env=env, volumes=(volume,))
    assert done.returncode == 0, f"airflow db migrate failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return volume, env


def tasks_test(image, home, db, dag_id: str, task_id: str, logical_date: str, params: dict):
    volume, env = db
    command = ["airflow", "tasks", "test", dag_id, task_id, logical_date, "--task-params", json.dumps(params)]
    return in_pod(image, home, command, env=env, volumes=(volume,))


def returned_value(done: subprocess.CompletedProcess) -> str:
    """What the task returned, from the operator's `Done. Returned value was: ...` log line."""
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"exit {done.returncode}:\n{output[-6000:]}"
    marker = "Done. Returned value was: "
    lines = [line for line in output.splitlines() if marker in line]
    assert len(lines) == 1, output[-6000:]
    assert "new_state=success" in output, output[-6000:]
    value = lines[0].split(marker, 1)[1]
    return value.split(" [airflow.task.operators", 1)[0].strip()


# --- the DAGs in the image ------------------------------------------------------------------------------


def test_the_baked_dags_parse_with_no_import_error_under_the_cluster_profile(dag_report):
    assert dag_report["import_errors"] == {}
    assert dag_report["warnings"] == {}  # the UI shows these as DAG warnings
    assert set(dag_report["dags"]) == DAG_IDS
    # The ids the DAG files declare are the ones the image parsed.
    declared = {
        line.split('"')[1]
        for path in (REPO / "dags").glob("*.py")
        for line in path.read_text().splitlines()
        if line.strip().startswith('dag_id="')
    }
    assert declared == DAG_IDS


def test_the_retrain_dag_runs_its_training_steps_as_pods_of_the_training_image(dag_report):
    tasks = dag_report["dags"]["retrain_fraud_model"]
    pods = {task_id for task_id, task in tasks.items() if "KubernetesPodOperator" in task["bases"]}
    assert pods == POD_STEPS
    python = {task_id for task_id, task in tasks.items() if "PythonOperator" in task["bases"]}
    assert python == {"as_of_date", "training_set", "publish_model", "ask_approval"}
    assert set(tasks) == pods | python


def test_the_tuning_dag_runs_its_study_steps_and_trials_as_pods_of_the_training_image(dag_report):
    tasks = dag_report["dags"]["tune_fraud_model"]
    pods = {task_id for task_id, task in tasks.items() if "KubernetesPodOperator" in task["bases"]}
    assert pods == {"start_study", "trial", "finish_study"}
    python = {task_id for task_id, task in tasks.items() if "PythonOperator" in task["bases"]}
    assert python == {"as_of_date", "training_set"}


# --- every task's code in the image ---------------------------------------------------------------------


def test_every_python_task_and_what_its_body_imports_import_in_the_image(dag_report):
    failures = []
    python_tasks = 0
    for dag_id, tasks in sorted(dag_report["dags"].items()):
        for task_id, task in sorted(tasks.items()):
            if "PythonOperator" in task["bases"]:
                python_tasks += 1
                assert task.get("callable_module_loaded"), f"{dag_id}.{task_id}: callable not found"
            failures += [f"{dag_id}.{task_id}: {module}: {error}" for module, error in task["errors"].items()]
    assert not failures, "\n".join(failures)
    assert python_tasks >= 15  # every DAG's tasks were looked at, mapped ones included
    assert dag_report["training_only_loaded"] == []


def test_only_the_training_set_task_uses_the_training_package_and_it_imports_without_torch(dag_report):
    users = {
        (dag_id, task_id)
        for dag_id, tasks in dag_report["dags"].items()
        for task_id, task in tasks.items()
        if "PythonOperator" in task["bases"]
        and any(module.split(".")[0] == "training" for module in task["imports"])
    }
    assert users == set(TRAINING_PACKAGE_TASKS)
    for (dag_id, task_id), module in TRAINING_PACKAGE_TASKS.items():
        task = dag_report["dags"][dag_id][task_id]
        assert module in task["imports"]
        assert task["errors"] == {}  # imported in an image with no torch or MLflow


def test_the_probe_sees_an_import_a_task_would_fail_on(airflow_image, shared_home, tmp_path):
    """The import check is not vacuous: a DAG whose task body imports torch is reported, parse still clean."""
    image, _ = airflow_image
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "uses_torch.py").write_text(
        "import pendulum\n"
        "from airflow.sdk import DAG, task\n\n"
        'with DAG(dag_id="uses_torch", schedule=None, start_date=pendulum.datetime(2026, 1, 1)):\n\n'
        "    @task\n"
        "    def fit():\n"
        "        from training import loop\n"
        "        import torch\n"
        "        return torch.__version__\n\n"
        "    fit()\n"
    )
    dags.chmod(0o755)
    done = in_pod(
        image,
        shared_home,
        ["python", "-c", DAG_PROBE, "/probe-dags", ",".join(FIRST_PARTY), ",".join(TRAINING_ONLY)],
        volumes=(f"{dags}:/probe-dags:ro",),
    )
    report = _report(done)
    assert report["import_errors"] == {}
    errors = report["dags"]["uses_torch"]["fit"]["errors"]
    assert set(errors) == {"training.loop", "torch"}, errors
    assert all("ModuleNotFoundError" in error and "torch" in error for error in errors.values())


# --- tasks run for real ---------------------------------------------------------------------------------


def test_the_retrain_dags_as_of_date_task_runs_in_the_image(airflow_image, shared_home, airflow_db):
    image, _ = airflow_image
    done = tasks_test(
        image,
        shared_home,
        airflow_db,
        "retrain_fraud_model",
        "as_of_date",
        "2026-03-02",
        {"as_of": "2026-02-14"},
    )
    assert returned_value(done) == "2026-02-14"


def test_the_landing_task_writes_to_the_shared_volume_what_this_checkout_writes(
    airflow_image, shared_home, airflow_db, tmp_path
):
    from pipelines.synthetic.landing import land_synthetic

    image, _ = airflow_image
    params = {"rows_per_day": 300, "seed": 11, "faults": "duplicates=0.02", "feed_start": "2026-01-01"}
    done = tasks_test(
        image, shared_home, airflow_db, "synthetic_landing", "land_arrival", "2026-01-03", params
    )
    # A daily interval timetable: the run at 2026-01-03 covers [01-02, 01-03), so it lands 01-02.
    value = returned_value(done)
    assert "'arrival_date': '2026-01-02'" in value, value
    landed = shared_home / "landing" / "2026-01-02"
    files = sorted(p for p in landed.iterdir())
    assert {p.name for p in files} >= {"_SUCCESS", "_GENERATED_BY", "_manifest.json"}
    # Written by the image's user into the volume (group 0, as the chart's fsGroup gives it).
    assert {(p.stat().st_uid, p.stat().st_gid) for p in [landed, *files]} == {(AIRFLOW_UID, 0)}

    expected = tmp_path / "landing"
    land_synthetic(
        Settings(home=tmp_path),
        start=date(2026, 1, 2),
        days=1,
        rows_per_day=params["rows_per_day"],
        seed=params["seed"],
        faults=params["faults"],
        landing=expected,
        feed_start=date.fromisoformat(params["feed_start"]),
    )

    def digests(folder: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}

    assert digests(landed) == digests(expected / "2026-01-02")


# --- the image itself -----------------------------------------------------------------------------------


def test_the_image_carries_its_commit_runs_as_uid_50000_has_a_jvm_and_no_training_stack(airflow_image):
    image, commit = airflow_image
    # The image's own environment: no pod variables, no volume (what `docker run` of the image gives).
    done = podman.run(
        ["run", "--rm", "--network=none", image, "python", "-c", IDENTITY_PROBE,
         ",".join(TRAINING_ONLY), "airflow,pyspark,great_expectations,dvc,feast,psycopg2,training.steps"],
    )  # fmt: skip
    report = _report(done)
    assert report["commit"] == commit
    assert (report["uid"], report["gid"], report["user"]) == (AIRFLOW_UID, 0, "airflow")
    assert report["java_exit"] == 0 and "version" in report["java"], report["java"]
    assert report["spark_sum"] == 45  # Spark's JVM starts and computes in the image
    assert report["python"] == "/opt/venv/bin/python" and report["version"] == [3, 11]
    assert report["airflow"] == "/opt/venv/bin/airflow"
    assert report["airflow_home"] == report["cwd"] == "/opt/airflow"
    assert report["profile"] == "cluster" and report["home"] == contract.DATA_MOUNT
    assert report["pickle"] == "false"
    assert report["missing"] == dict.fromkeys(TRAINING_ONLY, True)
    assert all(report["present"].values()), report["present"]

    inspect = json.loads(podman.run(["image", "inspect", image]).stdout)[0]
    assert inspect["Config"]["User"] == str(AIRFLOW_UID)
    assert f"MLOPS_GIT_COMMIT={commit}" in inspect["Config"]["Env"]


def test_the_build_refuses_an_empty_commit(airflow_image):
    """GIT_COMMIT is required: every layer before it is cached, so the refusal costs seconds."""
    base = podman.base_image()
    with pytest.raises(RuntimeError, match="GIT_COMMIT"):
        podman.build_image(
            "infra/docker/airflow.Dockerfile",
            "localhost/mlops-fraud-airflow:podman-test-no-commit",
            {"BASE_IMAGE": base, "GIT_COMMIT": ""},
        )
    assert not podman.image_exists("localhost/mlops-fraud-airflow:podman-test-no-commit")
