"""The three images: what each Dockerfile installs, the dependency closure that follows, and what it runs as.

No Docker engine is needed: the Dockerfiles are parsed, and the packages an image would get are computed by
walking the project's extras through the installed distributions' metadata (the same versions the lock pins).
checkov's dockerfile framework lints all three (tests/integration/test_infra_k8s.py).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from orchestration import k8s_contract as contract
from orchestration.tasks import BATCH_SCORING_COMMAND, MONITORING_COMMAND

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "infra" / "docker"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
# The project's own packages (what its wheel holds).
OUR_PACKAGES = set(PYPROJECT["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])
LOCK = dict(
    line.split("==", 1) for line in (REPO / "requirements.lock").read_text().splitlines() if "==" in line
)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in dockerfile.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        logical.append(current + stripped)
        current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def arg_defaults(dockerfile: Path) -> dict[str, str]:
    """The build arguments declared before the first FROM, with their defaults (what a plain build uses)."""
    defaults = {}
    for op, args in instructions(dockerfile):
        if op == "FROM":
            break
        if op == "ARG" and "=" in args:
            name, _, value = args.partition("=")
            defaults[name] = value
    return defaults


def base_images(dockerfile: Path) -> list[str]:
    """Each stage's base image as a plain build resolves it (build arguments at their defaults)."""
    defaults = arg_defaults(dockerfile)
    bases = []
    for op, args in instructions(dockerfile):
        if op == "FROM":
            base = args.split()[0]
            for name, value in defaults.items():
                base = base.replace(f"${{{name}}}", value)
            bases.append(base)
    return bases


def final_stage(dockerfile: Path) -> list[tuple[str, str]]:
    steps = instructions(dockerfile)
    last_from = max(i for i, (op, _) in enumerate(steps) if op == "FROM")
    return steps[last_from:]


def installed_extras(dockerfile: Path) -> set[str]:
    runs = [
        args
        for op, args in instructions(dockerfile)
        if op == "RUN" and re.search(r"(pip install|uv_install\.py) .*\"\.\[", args)
    ]
    assert runs, f"{dockerfile.name}: installs no project extras"
    extras = set()
    for run in runs:  # the dependencies' layer and the project's own: the same extras
        match = re.search(r"--constraint requirements\.lock \"\.\[([a-z,]+)\]\"", run)
        assert match, f"{dockerfile.name}: the project must be installed with the lock as constraints: {run}"
        extras.add(match.group(1))
    (only,) = extras
    return set(only.split(","))


def closure(extras: set[str]) -> set[str]:
    """Every distribution `pip install .[extras]` pulls in, by canonical name (markers evaluated here)."""
    declared = PROJECT["dependencies"] + [
        r for extra in extras for r in PROJECT["optional-dependencies"][extra]
    ]
    pending = [Requirement(r) for r in declared]
    seen: set[tuple[str, str]] = set()
    while pending:
        requirement = pending.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        for extra in ["", *sorted(requirement.extras)]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for text in metadata.distribution(name).requires or []:
                dependency = Requirement(text)
                # A marker is judged once, with the extra it was reached through, then dropped.
                if dependency.marker is None or dependency.marker.evaluate({"extra": extra}):
                    dependency.marker = None
                    pending.append(dependency)
    return {name for name, _ in seen}


TRAINING = DOCKER / "training.Dockerfile"
AIRFLOW = DOCKER / "airflow.Dockerfile"
SERVING = DOCKER / "serving.Dockerfile"
IMAGES = [TRAINING, AIRFLOW, SERVING]


@pytest.mark.parametrize(
    ("dockerfile", "extras"),
    [
        (TRAINING, {"training", "cluster"}),
        (AIRFLOW, {"airflow", "data", "cluster"}),
        (SERVING, {"serving", "cluster"}),
    ],
)
def test_each_image_installs_its_extras_constrained_by_the_lock(dockerfile, extras):
    assert installed_extras(dockerfile) == extras


def test_the_airflow_image_carries_no_torch_and_the_training_image_no_airflow():
    airflow = closure(installed_extras(AIRFLOW))
    training = closure(installed_extras(TRAINING))
    assert not {"torch", "mlflow", "onnxruntime"} & airflow
    assert not any(name.startswith("nvidia-") for name in airflow)
    assert not {"apache-airflow", "apache-airflow-core", "apache-airflow-task-sdk", "pyspark"} & training
    # What each image is for is in it.
    assert {"apache-airflow", "apache-airflow-providers-cncf-kubernetes", "pyspark", "feast"} <= airflow
    assert {"torch", "mlflow", "onnx", "onnxruntime"} <= training


def test_the_scoring_image_carries_the_onnx_runtime_and_no_torch_airflow_spark_or_full_mlflow():
    """The lock pins torch (for the training image); as constraints it installs nothing the extras do not
    pull in, so the scoring image's closure decides what it carries."""
    serving = closure(installed_extras(SERVING))
    assert "torch" in LOCK
    assert not {"torch", "mlflow", "onnx", "scikit-learn", "matplotlib", "dvc", "dvc-data"} & serving
    assert not {"apache-airflow", "apache-airflow-core", "pyspark", "great-expectations"} & serving
    assert not any(name.startswith("nvidia-") for name in serving)
    assert {"fastapi", "uvicorn", "onnxruntime", "mlflow-skinny", "feast", "redis", "pyarrow"} <= serving
    assert {"psycopg2-binary", "uvloop", "httptools"} <= serving  # cluster extra, uvicorn[standard]


# Modules the scoring service imports only inside functions, when it first needs them.
SERVING_LAZY_IMPORTS = ("uvicorn", "onnxruntime", "mlflow", "feast", "redis", "pyarrow.parquet")
IMPORT_GUARD = """
import importlib, importlib.abc, json, pkgutil, sys
allowed, foreign, modules = json.loads(sys.argv[1])

class NotInTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in foreign and top not in allowed:
            raise ModuleNotFoundError(f"{top} is not in the scoring image (imported as {name})")
        return None

sys.meta_path.insert(0, NotInTheImage())
import serving
names = [f"serving.{m.name}" for m in pkgutil.iter_modules(serving.__path__)] + modules
for name in names:
    importlib.import_module(name)
print(json.dumps(sorted(names)))
"""


def test_everything_the_scoring_service_imports_is_in_the_scoring_image():
    """Import every module of serving/, the `mlops` CLI that runs it and the libraries it loads lazily, in a
    process where any third-party module outside the scoring image's closure fails to import."""
    distributions = closure(installed_extras(SERVING))
    owners = metadata.packages_distributions()
    foreign = {module for module in owners if module not in OUR_PACKAGES}
    allowed = {
        module
        for module, names in owners.items()
        if any(canonicalize_name(name) in distributions for name in names)
    }
    assert {"torch", "airflow", "pyspark"} <= foreign - allowed, "the guard would not catch them"
    modules = ["mlops.cli", *SERVING_LAZY_IMPORTS]
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_GUARD, json.dumps([sorted(allowed), sorted(foreign), modules])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"serving.app", "serving.models", "serving.scoring_log", "mlops.cli"} <= set(imported)


def test_the_import_guard_refuses_a_module_outside_the_scoring_image():
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_GUARD, json.dumps([[], ["torch"], ["torch"]])],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert "torch is not in the scoring image" in done.stderr


def copied_packages(dockerfile: Path) -> set[str]:
    """Our packages the image's final stage (or the stage it copies its environment from) holds."""
    return {
        args.split()[0]
        for op, args in instructions(dockerfile)
        if op == "COPY" and args.split()[0] in OUR_PACKAGES
    }


def module_file(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


def runtime_imports(source: str) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every absolute import that can run: at module level and inside functions
    alike (a lazy import runs the first time its function does), not under `if TYPE_CHECKING:`."""
    found: list[tuple[int, str, list[str]]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module, [alias.name for alias in node.names]))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return found


def third_party_reached(entries: list[str], copied: set[str]) -> dict[str, set[str]]:
    """Every third-party top-level module that the entry modules can import, followed through our own modules
    statically (every import inside every function counts), mapped to the files that import it. Importing one
    of our packages the image does not copy counts too, as `<package> (not copied)`."""
    reached: dict[str, set[str]] = {}
    seen: set[str] = set()
    pending = list(entries)
    while pending:
        name = pending.pop()
        if name in seen or (path := module_file(name)) is None:
            continue
        seen.add(name)
        parts = name.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # a package's __init__ runs first
        where = str(path.relative_to(REPO))
        for _, module, names in runtime_imports(path.read_text()):
            top = module.split(".")[0]
            if top not in OUR_PACKAGES:
                if top not in sys.stdlib_module_names and top != "__future__":
                    reached.setdefault(top, set()).add(where)
            elif top not in copied:
                reached.setdefault(f"{top} (not copied)", set()).add(where)
            else:
                pending.append(module)
                pending.extend(f"{module}.{n}" for n in names if module_file(f"{module}.{n}"))
    return reached


# What each image runs (its pods' commands, its CMD), as the modules that start.
IMAGE_ENTRIES = {
    TRAINING: [
        f"{contract.TRAINING_COMMAND[2]}.__main__",
        f"{MONITORING_COMMAND[2]}.__main__",
        BATCH_SCORING_COMMAND[2],  # a module run as a script
    ],
    SERVING: ["serving.app", "serving.auth"],  # `mlops serve` imports these two (mlops/cli.py serve)
}
# Libraries outside an image that our code in it imports inside functions the image never runs, by the files
# allowed to: a new file reaching one (or a new library) fails the test until it is judged here.
NOT_RUN_IN_THE_IMAGE = {
    TRAINING: {
        # DVC versions datasets in the Airflow image's tasks; the pods read a revision's files by path.
        "dvc": {"pipelines/versioning.py"},
        # Feast materializes and serves in the Airflow and scoring images; training reads only the view names.
        "feast": {
            "features/definitions.py",
            "features/feast_private.py",
            "features/online_store.py",
            "features/repo.py",
        },
        # The replay's raw ids come from the landing files (serving/replay.py original_ids, Spark's reader
        # module); batch scoring reads silver's pseudonyms (day_events(raw_ids=False)) and never calls it.
        "pyspark": {"pipelines/ingest/landing.py", "pipelines/spark.py"},
    },
    SERVING: {},
}


@pytest.mark.parametrize("dockerfile", list(IMAGE_ENTRIES), ids=lambda path: path.stem)
def test_every_import_the_images_commands_can_reach_is_in_the_image(dockerfile):
    """Statically, so an import inside a function counts before a pod first runs it: the monitor pod (training
    image) once reached prometheus_client, a scoring-image library, through serving.scorer, and failed only
    there, in the podman test."""
    distributions = closure(installed_extras(dockerfile))
    owners = metadata.packages_distributions()
    outside = {}
    for top, files in third_party_reached(IMAGE_ENTRIES[dockerfile], copied_packages(dockerfile)).items():
        if any(canonicalize_name(name) in distributions for name in owners.get(top, [])):
            continue
        unexplained = files - NOT_RUN_IN_THE_IMAGE[dockerfile].get(top, set())
        if unexplained:
            outside[top] = sorted(unexplained)
    assert not outside, f"{dockerfile.name}: imports of libraries the image does not install: {outside}"


def test_the_static_walk_follows_lazy_imports_into_our_packages():
    # monitoring.performance imports serving.scoring_log inside a function: the walk must reach it, and what
    # it imports (pyarrow), from the monitor's entry point.
    reached = third_party_reached(["monitoring.__main__"], OUR_PACKAGES)
    assert "pyarrow" in reached
    assert "serving/scoring_log.py" in reached["pyarrow"]
    assert third_party_reached(["monitoring.__main__"], {"monitoring"}).keys() >= {"serving (not copied)"}


def test_the_closure_follows_transitive_dependencies_and_extras():
    # sympy comes only through torch, alembic through mlflow, redis through feast[redis]: if the walk stopped
    # at the first level, the image checks above would pass for the wrong reason.
    assert {"sympy", "alembic"} <= closure({"training"})
    assert "redis" in closure({"data"})
    everything = closure(set(PROJECT["optional-dependencies"]) - {"all"})
    assert {"torch", "apache-airflow"} <= everything


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_every_base_image_is_pinned(dockerfile):
    bases = base_images(dockerfile)
    assert bases
    for base in bases:
        tag = base.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest" and "$" not in base, f"{dockerfile.name}: FROM {base}"


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_every_base_image_is_a_build_argument_so_the_same_file_builds_on_a_local_base(dockerfile):
    defaults = arg_defaults(dockerfile)
    for op, args in instructions(dockerfile):
        if op == "FROM":
            base = args.split()[0]
            assert base.startswith("${") and base.endswith("}"), f"{dockerfile.name}: FROM {base}"
            assert base[2:-1] in defaults, f"{dockerfile.name}: {base} has no default before the first FROM"


def test_the_training_image_is_cuda_runtime_non_root_and_runs_the_training_cli():
    stage = final_stage(TRAINING)
    base = base_images(TRAINING)[-1]
    assert base.startswith("nvidia/cuda:") and "-runtime-" in base
    users = [args for op, args in stage if op == "USER"]
    assert users[-1] == f"{contract.TRAINING_UID}:{contract.TRAINING_UID}"
    (entrypoint,) = [args for op, args in stage if op == "ENTRYPOINT"]
    assert json.loads(entrypoint) == list(contract.TRAINING_COMMAND)
    (python,) = [
        args for op, args in instructions(TRAINING) if op == "ARG" and args.startswith("PYTHON_VERSION=")
    ]
    assert python.removeprefix("PYTHON_VERSION=").startswith("3.11.")  # pyproject: requires-python <3.12


def test_the_airflow_image_is_the_official_base_of_the_locked_airflow_version_and_non_root():
    stage = final_stage(AIRFLOW)
    assert base_images(AIRFLOW)[-1] == f"apache/airflow:{LOCK['apache-airflow']}-python3.11"
    users = [args for op, args in stage if op == "USER"]
    assert users[-1] not in ("root", "0")
    copies = [args for op, args in stage if op == "COPY"]
    assert any(args.endswith("dags /opt/airflow/dags") for args in copies), "DAGs are baked into the image"


def test_the_scoring_image_is_python_311_non_root_and_runs_the_deployments_command():
    stage = final_stage(SERVING)
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", base_images(SERVING)[-1])
    users = [args for op, args in stage if op == "USER"]
    assert users[-1] == "10001:10001"
    (cmd,) = [args for op, args in stage if op == "CMD"]
    assert not [args for op, args in stage if op == "ENTRYPOINT"]
    # The Deployment (and the chart) run the same command, on the port its probes and Service use.
    manifest = REPO / "infra" / "k8s" / "base" / "serving" / "fraud-scoring.yaml"
    deployment = next(d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        json.loads(cmd) == container["command"] == ["mlops", "serve", "--host", "0.0.0.0", "--port", "8000"]
    )
    (port,) = container["ports"]
    assert [args for op, args in stage if op == "EXPOSE"] == [str(port["containerPort"])] == ["8000"]
    assert pod["securityContext"]["runAsUser"] == 10001
    env = dict(
        line.split("=", 1) for op, args in stage if op == "ENV" for line in args.split() if "=" in line
    )
    assert env["HOME"] == "/tmp" and env["PYTHONDONTWRITEBYTECODE"] == "1"  # read-only root: /tmp writable
    assert env["MLFLOW_ALLOW_PICKLE_DESERIALIZATION"] == "false"


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_the_commit_is_required_and_baked_in_last(dockerfile):
    """GIT_COMMIT has no default, an empty one stops the build, and it becomes MLOPS_GIT_COMMIT after every
    layer that installs or copies anything, so a new commit rebuilds only that last layer."""
    stage = final_stage(dockerfile)
    (arg,) = [i for i, (op, args) in enumerate(stage) if op == "ARG" and args.startswith("GIT_COMMIT")]
    assert stage[arg][1] == "GIT_COMMIT"
    guard, env = stage[arg + 1], stage[arg + 2]
    assert guard[0] == "RUN" and guard[1].startswith('test -n "${GIT_COMMIT}" || {') and "exit 1" in guard[1]
    assert env == ("ENV", "MLOPS_GIT_COMMIT=${GIT_COMMIT}")
    assert not [op for op, _ in stage[arg + 3 :] if op in ("RUN", "COPY", "ADD")]


@pytest.mark.parametrize("dockerfile", IMAGES)
def test_the_build_context_admits_exactly_what_the_dockerfile_copies(dockerfile):
    ignore = [
        line.strip()
        for line in Path(f"{dockerfile}.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*", "the context starts empty and admits files one by one"
    admitted = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copied = set()
    for op, args in instructions(dockerfile):
        if op == "COPY" and "--from=" not in args:
            sources = [word for word in args.split() if not word.startswith("--")][:-1]
            copied |= set(sources)
    assert copied == admitted
    for source in copied:
        assert (REPO / source).exists(), f"{dockerfile.name} copies {source}, which is not in the repository"
    assert not {".venv", "var", ".venv-infra", ".git"} & admitted
