"""The pod command for more than one GPU, run for real: `torchrun --nproc-per-node=2 -m training train` on
the CPU (gloo). Every process trains its share; only rank 0 opens the MLflow run, logs the model and writes
the XCom file (a second run, or two writers of return.json, would be a bug the one-GPU path never shows)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import Settings
from orchestration import k8s_contract as contract
from tests.integration.training_sets import versioned_training_set

pytestmark = pytest.mark.integration


def test_under_torchrun_only_rank_0_opens_the_mlflow_run_and_reports(tmp_path):
    import mlflow

    settings = Settings(home=tmp_path / "home")
    rev = versioned_training_set(settings)
    xcom = tmp_path / "xcom" / "return.json"
    command = contract.training_command(gpus=2)
    assert command[0] == "torchrun" and "--nproc-per-node=2" in command
    torchrun = Path(sys.executable).with_name("torchrun")
    done = subprocess.run(
        [str(torchrun), *command[1:], "train", "--training-set-rev", rev, "--xcom-path", str(xcom),
         "--device", "cpu", "--epochs", "2", "--batch-size", "256"],
        env={**os.environ, "MLOPS_HOME": str(settings.home), "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 1, done.stdout  # rank 0 only
    (report,) = reports
    assert report["status"] == "trained" and report["training_set_rev"] == rev
    assert json.loads(xcom.read_text())["run_id"] == report["run_id"]

    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    runs = mlflow.search_runs(experiment_names=["fraud-detector"], output_format="list")
    assert [run.info.run_id for run in runs] == [report["run_id"]]
    assert runs[0].data.tags["world_size"] == "2"
    assert runs[0].data.tags["lineage.training_set_rev"] == rev
