"""The cluster's Spark as the manifests deploy it, started on loopback: the Master, the Workers (as many as
the replicas) and the Spark Connect server of infra/k8s/base/spark/spark.yaml, each with its container's own
command, arguments and environment, and the Airflow pods' Spark settings from infra/helm/airflow/values.yaml.
What changes is only what cannot be the same on one machine: the Services' names and the pods' addresses
become 127.0.0.1, ports become free ones, a pod's /tmp a folder of the test, /mlops the test's MLOPS_HOME, the
image's /opt/venv this virtual environment. A setting changed in the manifests or the values changes what the
cluster end-to-end test runs.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from orchestration import k8s_contract as contract
from tests.conftest import _STANDALONE_UI, free_port, spark_standalone_status, wait_for

REPO = Path(__file__).resolve().parents[2]
MANIFEST = REPO / "infra" / "k8s" / "base" / "spark" / "spark.yaml"
AIRFLOW_VALUES = REPO / "infra" / "helm" / "airflow" / "values.yaml"
IMAGE_VENV = "/opt/venv"
SERVICE_DOMAIN = f"{contract.ORCHESTRATION_NAMESPACE}.svc.cluster.local"


@dataclass(frozen=True)
class ChartSpark:
    master: str  # spark://127.0.0.1:<port>, the manifests' Master
    remote: str  # sc://127.0.0.1:<port>, their Connect server
    workers: int  # the worker Deployment's replicas
    settings: dict[str, str]  # the Airflow pods' Spark settings (values.yaml), addresses remapped


def _objects() -> dict[tuple[str, str], dict[str, Any]]:
    """The manifest's objects by (kind, name)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def _container(objects: dict[tuple[str, str], dict[str, Any]], deployment: str) -> dict[str, Any]:
    (container,) = objects["Deployment", deployment]["spec"]["template"]["spec"]["containers"]
    return container


def _service_port(objects: dict[tuple[str, str], dict[str, Any]], name: str, port_name: str) -> int:
    (port,) = [p["port"] for p in objects["Service", name]["spec"]["ports"] if p["name"] == port_name]
    return port


def airflow_spark_settings() -> dict[str, str]:
    """Every Spark setting the Airflow pods get (values.yaml `env`), as written there."""
    values = yaml.safe_load(AIRFLOW_VALUES.read_text())
    return {item["name"]: item["value"] for item in values["env"] if "SPARK" in item["name"]}


@dataclass(frozen=True)
class _Pod:
    name: str
    args: list[str]
    env: dict[str, str]
    cwd: Path


@contextlib.contextmanager
def chart_spark(work: Path, home: Path, jvm_options: dict[str, str]) -> Iterator[ChartSpark]:
    """Start the manifests' Spark on loopback under `work` (logs there), the lake at `home`; stop it after.
    `jvm_options`: the JVM options of the stacks' tests (tests/e2e/conftest.py stack_env), the one setting
    the test sets itself: MLOPS_SPARK_JAVA_OPTIONS changes how the JIT compiles, not what Spark does."""
    objects = _objects()
    master_port, master_ui, connect_port = free_port(), free_port(), free_port()
    master = f"spark://spark-master.{SERVICE_DOMAIN}:{_service_port(objects, 'spark-master', 'spark')}"
    remote = f"sc://spark-connect.{SERVICE_DOMAIN}:{_service_port(objects, 'spark-connect', 'grpc')}"
    addresses = {master: f"spark://127.0.0.1:{master_port}", remote: f"sc://127.0.0.1:{connect_port}"}

    def local(value: str, tmp: Path) -> str:
        for address, here in addresses.items():
            value = value.replace(address, here)
        value = value.replace("$(POD_IP)", "127.0.0.1")
        for image_path, here in ((IMAGE_VENV, Path(sys.prefix)), (contract.DATA_MOUNT, home), ("/tmp", tmp)):
            if value == image_path or value.startswith(image_path + "/"):
                return str(here) + value.removeprefix(image_path)
        return value

    def pod(name: str, container: dict[str, Any], ports: dict[str, int]) -> _Pod:
        tmp = work / name / "tmp"  # the pod's own /tmp
        args = [*container["command"], *container.get("args", [])]
        # A port given as "--flag N" is the pod's: a free one on loopback instead.
        pairs = [f"{previous} {arg}" for previous, arg in itertools.pairwise(["", *args])]
        assert set(ports) <= set(pairs), f"{container['name']}: the manifest no longer says {sorted(ports)}"
        args = [
            str(ports[pair]) if pair in ports else local(arg, tmp)
            for pair, arg in zip(pairs, args, strict=True)
        ]
        # The command from the image's PATH (/opt/venv/bin): this environment's, never mapped as a path (a
        # virtual environment under /tmp would read as the pod's /tmp).
        args[0] = str(Path(sys.executable).with_name(container["command"][0]))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLOPS_", "SPARK_", "PYSPARK_"))}
        for item in container.get("env", []):
            if "value" in item:
                env[item["name"]] = local(item["value"], tmp)
            elif item["valueFrom"].get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[item["name"]] = "127.0.0.1"
            else:
                raise AssertionError(f"{container['name']}: no local stand-in for {item}")
        # The image's PATH starts with its virtual environment's bin.
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.update(SPARK_LOG_DIR=str(work / name / "logs"), SPARK_LOCAL_IP="127.0.0.1")
        cwd = Path(local(container["workingDir"], tmp)) if "workingDir" in container else work / name
        return _Pod(name, args, env, cwd)

    replicas = objects["Deployment", "spark-worker"]["spec"]["replicas"]
    pods = [
        pod(
            "master",
            _container(objects, "spark-master"),
            {"--port 7077": master_port, "--webui-port 8080": master_ui},
        ),
        *(
            pod(f"worker-{n}", _container(objects, "spark-worker"), {"--webui-port 8081": free_port()})
            for n in range(1, replicas + 1)
        ),
        pod("connect", _container(objects, "spark-connect"), {"--port 15002": connect_port}),
    ]
    pods[-1].env.update(jvm_options)
    master_url = addresses[master]
    _STANDALONE_UI[master_url] = f"http://127.0.0.1:{master_ui}/json/"
    processes, logs = [], []
    try:
        for started in pods:
            for folder in (started.cwd, started.env.get("HOME", started.cwd)):
                Path(folder).mkdir(parents=True, exist_ok=True)
            logs.append((work / f"{started.name}.log").open("w"))
            processes.append(
                subprocess.Popen(
                    started.args,
                    env=started.env,
                    cwd=started.cwd,
                    stdout=logs[-1],
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            if started.name == "master":
                wait_for(lambda: spark_standalone_status(master_url) is not None, 120, f"the Master ({work})")

        def ready() -> bool:
            status = spark_standalone_status(master_url)
            apps = (status or {}).get("activeapps", [])
            return bool(status) and status.get("aliveworkers", 0) >= replicas and len(apps) == 1

        wait_for(ready, 180, f"{replicas} Workers and the Connect server on {master_url} (logs in {work})")
        settings = {name: local(value, work) for name, value in airflow_spark_settings().items()}
        yield ChartSpark(master_url, addresses[remote], replicas, settings)
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
        for handle in logs:
            handle.close()
