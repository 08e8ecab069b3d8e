"""A diverging run fails clearly, as a new user meets it: the training command with a learning rate that
blows the weights up stops at the first non-finite loss with an error naming the epoch, the step and the
setting to change, exits with the status its launcher reads as "do not retry", and leaves no model behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from core.errors import EXIT_PIPELINE_ERROR
from core.settings import Settings
from tests.integration.training_sets import versioned_training_set

pytestmark = pytest.mark.integration


def test_a_learning_rate_that_diverges_stops_training_with_the_setting_to_change(tmp_path):
    import mlflow

    settings = Settings(home=tmp_path / "home")
    rev = versioned_training_set(settings)
    done = subprocess.run(
        [sys.executable, "-m", "training", "train", "--training-set-rev", rev, "--device", "cpu",
         "--epochs", "3", "--batch-size", "128"],
        env={**os.environ, "MLOPS_HOME": str(settings.home), "MLOPS_TRAINING__LEARNING_RATE": "1e6"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == EXIT_PIPELINE_ERROR, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    failure = json.loads(done.stdout.strip().splitlines()[-1])
    assert failure["status"] == "failed" and failure["error"] == "TrainingDivergedError"
    message = failure["message"]
    assert "epoch 0" in message and "optimizer step" in message, message
    assert "learning rate 1e+06" in message and "MLOPS_TRAINING__LEARNING_RATE" in message, message

    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    (run,) = mlflow.search_runs(experiment_names=["fraud-detector"], output_format="list")
    assert run.info.status == "FAILED"
    assert not mlflow.MlflowClient().list_artifacts(run.info.run_id, "model"), "no model from a diverged run"
