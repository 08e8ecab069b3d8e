"""Containers for the image tests, without Docker or a cluster: Debian's podman (rootful, runc, cgroupfs),
a Debian base image made here with debootstrap and `podman import`, and the project's own Dockerfiles
built on it. Nothing comes from an image registry (none is reachable); packages come from the registries
this machine's pip and apt use.

Inside a build, pip must install what the host's pip would: its configuration (find-links with the CPU
torch build, index mirrors, constraints, the CA bundle of the network's proxy) is read from `pip config
list` when the test runs, written to a pip.conf mounted at /etc/pip.conf of the build containers, and every
local path it names is mounted read-only at the same place. No machine path is written into the repository.

Images are tagged by a hash of their inputs, so a rerun on the same machine reuses them (podman's own layer
cache does the same for the Dockerfile steps).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
# What the Debian base carries: the official Python images' equivalents (python3.11 with venv and pip).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
BASE_IMAGE = "localhost/mlops-test-base"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Known on this machine's podman 4.3: the OCI runtime, the cgroup manager and ulimits that fit a container.
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
"""


class PodmanUnavailableError(RuntimeError):
    """podman, runc or debootstrap is missing and cannot be installed here."""


def _run(args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=podman_env(), **kwargs)


def _check(done: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
        )
    return done


@cache
def _conf_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="mlops-podman-"))
    (folder / "containers.conf").write_text(CONTAINERS_CONF)
    return folder


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(_conf_dir() / "containers.conf")}


def ensure_tools() -> None:
    """podman, runc and debootstrap from Debian's packages, installed when missing (needs root)."""
    missing = [tool for tool in ("podman", "runc", "debootstrap") if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise PodmanUnavailableError(f"{missing} missing and no root apt-get to install them")
    from tests.conftest import machine_lock

    with machine_lock("apt"):  # another test worker may be installing kubectl or chromium
        missing = [tool for tool in missing if shutil.which(tool) is None]  # or had installed these
        if not missing:
            return
        for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
            done = subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=900,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
            _check(done, " ".join(args))


def image_exists(ref: str) -> bool:
    return _run(["podman", "image", "exists", ref], timeout=60).returncode == 0


def base_image() -> str:
    """A Debian bookworm image with Python 3.11, made with debootstrap and imported (once per machine)."""
    ensure_tools()
    key = hashlib.sha256(json.dumps([SUITE, BASE_PACKAGES, PATH_ENV]).encode()).hexdigest()[:12]
    ref = f"{BASE_IMAGE}:{SUITE}-{key}"
    if image_exists(ref):
        return ref
    with tempfile.TemporaryDirectory(prefix="mlops-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _check(
            subprocess.run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE,
                 str(rootfs), "http://deb.debian.org/debian"],
                capture_output=True, text=True, timeout=1200,
            ),
            "debootstrap",
        )  # fmt: skip
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        done = subprocess.run(
            ["podman", "import", "--change", f"ENV {PATH_ENV}", "-", ref],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            timeout=600,
            env=podman_env(),
        )
        tar.wait()
        _check(done, "podman import")
    return ref


@cache
def pip_configuration() -> tuple[str, tuple[str, ...]]:
    """The host pip's configuration as a pip.conf for the build containers, and the local paths it names
    (mounted read-only at the same place). Read from `pip config list` at run time."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    )
    settings: dict[str, str] = {}
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        key = name.rsplit(".", 1)[-1]
        settings[key] = value.strip().strip("'\"")
    paths: set[str] = set()
    for key in ("cert", "find-links", "constraint", "extra-index-url", "index-url", "client-cert"):
        for item in settings.get(key, "").split():
            path = item.removeprefix("file://").rstrip("/")
            if key.endswith("index-url") and path.endswith("/simple"):
                path = path.removesuffix("/simple")  # a file index links to files beside its simple/
            if path.startswith("/") and os.path.exists(path):
                paths.add(path)
    lines = ["[global]", *(f"{key} = {value}" for key, value in sorted(settings.items()))]
    return "\n".join(lines) + "\n", tuple(sorted(paths))


@cache
def build_volumes() -> tuple[str, ...]:
    """`--volume` arguments that give a build container the host pip's configuration and what it names
    (made once: concurrent builds mount the same pip.conf)."""
    conf, paths = pip_configuration()
    conf_file = _conf_dir() / "pip.conf"
    conf_file.write_text(conf)
    volumes = [f"--volume={conf_file}:/etc/pip.conf:ro"]
    for path in paths:
        volumes.append(f"--volume={path}:{path}:ro")
    return tuple(volumes)


def build_image(dockerfile: str, ref: str, build_args: dict[str, str], timeout: float = 1500) -> str:
    """Build infra/docker/<dockerfile> with the repository as its context and the given build arguments."""
    args = ["podman", "build", "--network=host", "--file", str(REPO / dockerfile), "--tag", ref]
    for name, value in build_args.items():
        args.append(f"--build-arg={name}={value}")
    ignore = REPO / f"{dockerfile}.dockerignore"
    if ignore.is_file():
        args.append(f"--ignorefile={ignore}")
    args += [*build_volumes(), str(REPO)]
    _check(_run(args, timeout=timeout), f"podman build of {dockerfile}")
    return ref


# The project's images the tests build: fixture name -> Dockerfile, tag, the build arguments set to the base.
PROJECT_IMAGES = {
    "airflow_image": (
        "infra/docker/airflow.Dockerfile",
        "localhost/mlops-fraud-airflow:podman-test",
        ("BASE_IMAGE",),
    ),
    "training_image": (
        "infra/docker/training.Dockerfile",
        "localhost/mlops-fraud-training:podman-test",
        ("BASE_IMAGE", "UV_IMAGE"),
    ),
    "serving_image": (
        "infra/docker/serving.Dockerfile",
        "localhost/mlops-fraud-scoring:podman-test",
        ("BASE_IMAGE",),
    ),
}
_builds: dict[str, Future] = {}
_pool = ThreadPoolExecutor(max_workers=len(PROJECT_IMAGES), thread_name_prefix="podman-build")


def project_image(fixture: str, session) -> tuple[str, str]:
    """The image of fixture `fixture` (a key of PROJECT_IMAGES), built on the local base with this
    checkout's commit as GIT_COMMIT; returns the image and the commit. Fails the test, with the reason,
    where podman cannot be had.

    The first request starts, beside it, the build of every other project image a test of this session
    asks for: a build is mostly one core of pip unpacking and compiling wheels, so two at once take little
    more than the longer one (a full run used to spend 311 + 274 s on them one after the other)."""
    import pytest

    if fixture not in _builds:
        try:
            base = base_image()  # once, here: the builds below must not both debootstrap it
        except PodmanUnavailableError as exc:
            pytest.fail(f"podman is needed for this test: {exc}")
        build_volumes()  # its pip.conf is written before the builds that mount it start
        wanted = {fixture} | {
            name
            for item in session.items
            for name in getattr(item, "fixturenames", ())
            if name in PROJECT_IMAGES and name not in _builds
        }
        for name in sorted(wanted):
            dockerfile, ref, base_args = PROJECT_IMAGES[name]
            args = {**dict.fromkeys(base_args, base), "GIT_COMMIT": checkout_commit()}
            if name == "training_image":
                args["TORCH_BUILD"] = "cpu"  # no GPU here: the CPU build pip's find-links hold
            _builds[name] = _pool.submit(build_image, dockerfile, ref, args)
    return _builds[fixture].result(), checkout_commit()


@cache
def checkout_commit() -> str:
    """This checkout's commit, the images' GIT_COMMIT (read once: a session's images carry the same)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unversioned"


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess:
    """A podman command with this module's configuration (not checked: the caller reads the result)."""
    return _run(["podman", *args], timeout=timeout)
