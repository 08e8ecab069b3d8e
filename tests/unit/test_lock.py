"""The lock file is in step with pyproject.toml and keeps the CPU torch build installable."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def _lock() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"requirements.lock: '{line}' is not pinned with =="
            pins[canonicalize_name(name)] = version
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        requirements += [Requirement(r) for r in extra if not r.startswith("mlops-fraud")]
    return requirements


@pytest.mark.parametrize("requirement", _declared(), ids=str)
def test_every_declared_dependency_is_pinned_within_its_range(requirement):
    lock = _lock()
    name = canonicalize_name(requirement.name)
    assert name in lock, f"{requirement.name} is declared but not locked: run `make lock`"
    assert requirement.specifier.contains(lock[name], prereleases=True), (
        f"{requirement.name}=={lock[name]} in the lock is outside {requirement.specifier}: run `make lock`"
    )


def test_torch_is_the_exact_cpu_installable_version_and_no_cuda_packages_are_locked():
    lock = _lock()
    assert lock["torch"] == "2.13.0"  # no local tag: each machine takes its own build of 2.13.0
    # nvidia-ml-py is NVIDIA's management library in pure Python (GPU telemetry), not a CUDA runtime package
    assert not [name for name in lock if name.startswith("nvidia-") and name != "nvidia-ml-py"]


def test_the_airflow_and_training_extras_stay_apart():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not any(r.startswith("torch") for r in extras["airflow"])
    assert not any(r.startswith("apache-airflow") for r in extras["training"])
