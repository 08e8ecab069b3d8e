"""MLflow's system metrics reach the GPU through NVIDIA's management library, which the training extra
installs: on a machine with a GPU the monitor opens NVML; here (no driver) it gets as far as NVML's own
"library not found", not MLflow's "pynvml is not installed" (which would mean no GPU metrics anywhere)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_training_extra_carries_psutil_and_nvidia_ml_py():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {r.split(">")[0].split("=")[0].split("<")[0] for r in extras["training"]}
    assert {"psutil", "nvidia-ml-py"} <= names


HAS_NVIDIA_DRIVER = Path("/proc/driver/nvidia/version").exists()


@pytest.mark.skipif(HAS_NVIDIA_DRIVER, reason="an NVIDIA driver is here: the next test applies")
def test_without_a_driver_mlflows_gpu_monitor_gets_as_far_as_nvml():
    pytest.importorskip("mlflow")
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

    assert "pynvml" in sys.modules  # imported by MLflow's monitor: the package is installed
    with pytest.raises(RuntimeError, match="Failed to initialize NVML") as raised:
        GPUMonitor()
    assert "not installed" not in str(raised.value)


@pytest.mark.skipif(not HAS_NVIDIA_DRIVER, reason="no NVIDIA driver on this machine")
def test_on_a_gpu_machine_mlflows_gpu_monitor_reads_utilization_and_memory():
    pytest.importorskip("mlflow")
    from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

    monitor = GPUMonitor()
    assert monitor.num_gpus >= 1
    monitor.collect_metrics()
    assert {"gpu_0_utilization_percentage", "gpu_0_memory_usage_megabytes"} <= set(monitor.metrics)
