"""An installed wheel finds every file the code reads at run time, as a checkout does.

The project is built into a wheel once, installed into a folder of its own, and imported from there by a
process that runs outside the checkout (`python -I`, the folder first on sys.path). In that process the GX
suites load and parse as GX suites, both profiles' Feast configuration renders, the `feast` CLI's folder
is there, and no data path the code resolved lies in the checkout, which is where a path derived from the
source tree would point. Images install the wheel (infra/docker/), so this is what runs in a pod.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from pipelines.suites import SUITE_NAMES, SUITES_FOLDER

REPO = Path(__file__).resolve().parents[2]
PACKAGES = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
    "packages"
]

# Runs in the fresh process; prints one JSON report as its last line. The assertions are the test's.
PROBE = r"""
import importlib.util, json, sys
site, packages = sys.argv[1], sys.argv[2].split(",")
sys.path.insert(0, site)

import yaml
from great_expectations.core.expectation_suite import ExpectationSuite

from core.settings import Profile, Settings
from features.repo import cli_repo_dir, config_template, render_config
from pipelines.suites import SUITE_NAMES, load_suite, suite_resource

report = {"origins": {p: importlib.util.find_spec(p).origin for p in packages}, "paths": {}}
report["suites"] = {}
for name in SUITE_NAMES:
    suite = ExpectationSuite(**load_suite(name))
    report["suites"][name] = {"name": suite.name, "expectations": len(suite.expectations)}
    report["paths"][f"suite {name}"] = str(suite_resource(name))
report["configs"] = {}
for profile in Profile:
    settings = Settings(profile=profile)
    report["configs"][profile.value] = {
        "config": yaml.safe_load(render_config(settings, project="wheel")),
        "feast_dir": str(settings.feast_dir),
    }
    report["paths"][f"feast template {profile.value}"] = str(config_template(profile))
report["paths"]["feast CLI repository"] = str(cli_repo_dir())
report["cli_repo_files"] = sorted(path.name for path in cli_repo_dir().iterdir())
print(json.dumps(report))
"""


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, **kwargs)
    if done.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-4000:]}"
        )
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    # Without build isolation when hatchling is at hand (faster, offline); otherwise pip fetches it.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *isolation, "-w", str(dist), str(REPO)])
    (built,) = dist.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-compile",
            "-q",
            "--target",
            str(site),
            str(wheel),
        ]
    )
    return site


@pytest.fixture(scope="module")
def report(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    outside = tmp_path_factory.mktemp("elsewhere")  # the working directory: not the checkout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_", "PYTHON"))}
    env["MLOPS_HOME"] = str(outside / "home")
    done = _run([sys.executable, "-I", "-c", PROBE, str(installed), ",".join(PACKAGES)], cwd=outside, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_wheel_holds_every_data_file_of_the_packages(wheel):
    """Every file beside the modules (suites, templates, the feast CLI's folder) is in the wheel."""
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    data_files = {
        path.relative_to(REPO).as_posix()
        for package in PACKAGES
        for path in (REPO / package).rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    expected = data_files | {f"pipelines/{SUITES_FOLDER}/{name}.json" for name in SUITE_NAMES}
    expected |= {"features/feast_repo/fraud_repo.py"}
    assert sorted(expected - in_wheel) == []


def test_the_installed_copy_is_what_the_process_imports(report, installed):
    for package, origin in report["origins"].items():
        assert Path(origin).is_relative_to(installed), f"{package} imported from {origin}, not the wheel"


def test_every_suite_the_pipeline_uses_loads_from_the_wheel_as_a_gx_suite(report):
    assert sorted(report["suites"]) == sorted(SUITE_NAMES)
    for name, suite in report["suites"].items():
        assert suite["name"] == name
        assert suite["expectations"] > 0, f"{name}: GX kept no expectation"


@pytest.mark.parametrize(("profile", "online_store"), [("local", "sqlite"), ("cluster", "redis")])
def test_each_profiles_feast_configuration_renders_from_the_wheel(report, profile, online_store):
    rendered, feast_dir = report["configs"][profile]["config"], report["configs"][profile]["feast_dir"]
    assert rendered["project"] == "wheel"
    assert rendered["online_store"]["type"] == online_store
    assert rendered["registry"]["path"] == f"{feast_dir}/registry.db"
    assert rendered["registry"]["registry_store_type"] == "features.registry_store.AtomicFileRegistryStore"


def test_the_feast_cli_repository_is_a_folder_of_the_wheel(report):
    assert "fraud_repo.py" in report["cli_repo_files"]


def test_no_data_path_lies_in_the_checkout(report, installed):
    assert len(report["paths"]) == len(SUITE_NAMES) + 3
    for what, path in report["paths"].items():
        assert not Path(path).is_relative_to(REPO), f"{what} resolved into the checkout: {path}"
        assert Path(path).is_relative_to(installed), f"{what} resolved outside the installed wheel: {path}"
