"""requirements-gpu.lock (make lock-gpu, scripts/lock_gpu.py): the CUDA build of requirements.lock's torch
and the exact wheels it needs, for the training image's CUDA variant. Read offline: what the two locks say
must agree, and the image must install and check what the GPU lock names."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(?P<name>[a-z0-9-]+)==(?P<version>\S+) --hash=sha256:(?P<digest>[0-9a-f]{64})$")


def _pins(path: Path) -> dict[str, str]:
    """The lock's pins, read as `make lock-gpu` reads them (scripts/lock_gpu.py pins)."""
    spec = importlib.util.spec_from_file_location("lock_gpu", REPO / "scripts" / "lock_gpu.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.pins(path)


def _gpu_lock() -> tuple[str, dict[str, re.Match]]:
    lines = (REPO / "requirements-gpu.lock").read_text().splitlines()
    (cuda,) = [line.split("=", 1)[1].strip() for line in lines if line.startswith("# torch.version.cuda =")]
    rows = [line for line in lines if not line.startswith("#")]
    matched = {m["name"]: m for m in map(LINE.match, rows) if m}
    assert len(matched) == len(rows), [row for row in rows if not LINE.match(row)]
    return cuda, matched


def test_every_wheel_is_pinned_by_version_and_digest_and_torch_is_the_locked_version():
    _, pinned = _gpu_lock()
    assert pinned["torch"]["version"] == _pins(REPO / "requirements.lock")["torch"]
    assert "triton" in pinned
    assert {"nvidia-cudnn-cu13", "nvidia-nccl-cu13", "nvidia-cublas", "nvidia-cuda-runtime"} <= set(pinned)
    assert all(re.fullmatch(r"torch|triton|nvidia-.*|cuda-.*", name) for name in pinned), sorted(pinned)


def test_the_cuda_version_the_image_checks_is_the_runtime_wheels():
    cuda, pinned = _gpu_lock()
    assert re.fullmatch(r"\d+\.\d+", cuda)
    assert pinned["nvidia-cuda-runtime"]["version"].startswith(f"{cuda}.")
    assert pinned["cuda-toolkit"]["version"].startswith(f"{cuda}.")


def test_nothing_the_gpu_lock_pins_contradicts_the_main_lock():
    _, pinned = _gpu_lock()
    main = _pins(REPO / "requirements.lock")
    assert {
        name: m["version"] for name, m in pinned.items() if name in main and main[name] != m["version"]
    } == {}


def test_the_training_image_installs_the_gpu_lock_without_find_links_and_checks_the_build():
    dockerfile = (REPO / "infra" / "docker" / "training.Dockerfile").read_text()
    assert "ARG TORCH_BUILD=cuda" in dockerfile
    assert "COPY pyproject.toml requirements.lock requirements-gpu.lock" in dockerfile
    cuda_case = re.search(r"cuda\) torch_build=\"([^\"]+)\"", dockerfile)
    assert cuda_case and cuda_case.group(1) == "--without-find-links --requirement requirements-gpu.lock"
    assert "sed -n 's/^# torch.version.cuda = //p' requirements-gpu.lock" in dockerfile
    assert "built == sys.argv[1]" in dockerfile  # the build fails unless torch.version.cuda is that
    cuda, _ = _gpu_lock()
    base = re.search(r"^ARG BASE_IMAGE=nvidia/cuda:(\d+\.\d+)\.\d+-runtime", dockerfile, re.MULTILINE)
    assert base and base.group(1) == cuda  # the toolkit refuses a node whose driver cannot run that build
