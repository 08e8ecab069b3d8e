"""MLflow tracking for a training run: the experiment, lineage tags, batched metrics.

Each profile's tracking URI comes from the settings. Locally the backend is SQLite under $MLOPS_HOME and
artifacts go next to it (not to ./mlruns of whatever folder the command runs in). Metrics are buffered
and sent with one log_batch call per epoch, so tracking costs one round trip per epoch, not per value.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.settings import REPO_ROOT, Profile, Settings

if TYPE_CHECKING:
    from mlflow import MlflowClient

EXPERIMENT = "fraud-detector"


@dataclass(frozen=True)
class Lineage:
    """Where a model came from; every field becomes an MLflow tag `lineage.<field>`."""

    training_set_rev: str
    as_of: str
    feature_service: str
    gx_suites: str
    gx_success: str
    git_commit: str
    image: str
    dag_id: str
    dag_run_id: str
    # The retrain's identity (training/steps.py retrain_identity): equal keys, equal inputs; "" when the
    # code's commit is unknown (no identity, never skipped).
    retrain_key: str = ""
    # The model's input names, in its matrix's order (JSON; ModelConfig.inputs): the version's tag that
    # `mlops features list` and a removal's check read without loading the model.
    model_inputs: str = ""

    def tags(self) -> dict[str, str]:
        return {f"lineage.{key}": str(value) for key, value in self.__dict__.items()}


def git_commit() -> str:
    """The commit of the code (the image bakes it in as MLOPS_GIT_COMMIT; a checkout asks git)."""
    if os.environ.get("MLOPS_GIT_COMMIT"):
        return os.environ["MLOPS_GIT_COMMIT"]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def code_identity() -> str:
    """The code as it is: its commit (an image's baked-in one, or the checkout's), and where the checkout has
    changes to tracked files other than documentation, `<commit>+<digest of the diff>` (the same changes, the
    same identity); "unknown" when git cannot say."""
    commit = git_commit()
    if os.environ.get("MLOPS_GIT_COMMIT") or commit == "unknown":
        return commit
    try:
        diff = subprocess.run(
            # documentation changes no model: left out of the digest
            [
                "git",
                "diff",
                "HEAD",
                "--no-ext-diff",
                "--binary",
                "--",
                ".",
                ":(exclude)docs",
                ":(exclude)*.md",
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not diff:
        return commit
    import hashlib

    return f"{commit}+{hashlib.sha256(diff).hexdigest()[:12]}"


def configure(settings: Settings) -> str:
    """Point mlflow at the profile's tracking server and make sure the experiment exists; its id.
    Also switches MLflow's pickle loading off for this process (training/artifacts.py)."""
    import mlflow

    from training.artifacts import forbid_pickle_deserialization

    forbid_pickle_deserialization()
    uri = settings.mlflow_tracking_uri
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    experiment = mlflow.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        return experiment.experiment_id
    location = None
    if settings.profile is Profile.LOCAL:
        artifacts = settings.mlflow_dir / "artifacts"
        artifacts.mkdir(parents=True, exist_ok=True)
        location = artifacts.as_uri()
    try:
        return mlflow.create_experiment(EXPERIMENT, artifact_location=location)
    except mlflow.exceptions.MlflowException:  # created by a parallel run in between
        experiment = mlflow.get_experiment_by_name(EXPERIMENT)
        if experiment is None:
            raise
        return experiment.experiment_id


def training_set_rev(settings: Settings, run_id: str) -> str:
    """The DVC revision of the training set a run trained on (its lineage tag)."""
    import mlflow

    configure(settings)
    return mlflow.MlflowClient().get_run(run_id).data.tags["lineage.training_set_rev"]


class MetricBuffer:
    """Collect metrics and send them in one batch."""

    def __init__(self, client: MlflowClient, run_id: str) -> None:
        self.client = client
        self.run_id = run_id
        self.pending: list = []
        self.seconds_logging = 0.0

    def add(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [Metric(key, float(value), now, step) for key, value in values.items()]

    def flush(self) -> None:
        if not self.pending:
            return
        started = time.perf_counter()
        for offset in range(0, len(self.pending), 1000):  # the server's batch limit
            self.client.log_batch(self.run_id, metrics=self.pending[offset : offset + 1000])
        self.pending = []
        self.seconds_logging += time.perf_counter() - started
