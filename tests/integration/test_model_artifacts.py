"""Models are stored and loaded as weights, never unpickled: against a real MLflow (SQLite, the local
profile's tracking store) a trained model round-trips through the registry, and artifacts that would run
code when unpickled (a booby-trapped weights file, a model pickled the old way by mlflow.pytorch) are
refused with an error that names the model and says what to do, with the payload never run."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow.exceptions import MlflowException
from mlflow.models import infer_signature
from torch import nn

from core.settings import Settings
from tests.model.tensors import make_split
from training.artifacts import (
    CONFIG_FILE,
    MODEL_WEIGHTS_PATH,
    PICKLE_SWITCH,
    WEIGHTS_FILE,
    ModelArtifactError,
    load_model,
    log_model,
    save_weights,
)
from training.dataset import NUMERIC_FEATURES
from training.loop import TrainConfig, train
from training.model import FraudMLP
from training.registry import ModelRegistry
from training.tracking import configure


class Payload:
    """Unpickling this writes `marker`: the proof that a loader ran code from the artifact."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('code from the artifact ran')",))


class PickledModule(nn.Module):
    """What `mlflow.pytorch.log_model(serialization_format="pickle")` would store for a tampered model."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.marker = marker

    def __reduce__(self):
        return Payload(self.marker).__reduce__()


@pytest.fixture
def tracking(monkeypatch, tmp_path):
    """The local profile's MLflow, configured as the steps configure it; pickles allowed by the environment
    beforehand, so the tests show that `configure` switches them off."""
    monkeypatch.setenv(PICKLE_SWITCH, "true")
    settings = Settings()
    settings.ensure_dirs()
    mlflow.set_experiment(experiment_id=configure(settings))
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    yield registry, tmp_path / "code-ran"
    mlflow.set_tracking_uri(None)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    torch.manual_seed(11)
    model = FraudMLP()
    data = make_split(4_000, seed=1)
    model.fit_normalization(data.x[:, : len(NUMERIC_FEATURES)])
    config = TrainConfig(epochs=1, batch_size=256, seed=11, stop_after_steps=8)
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    train(model, data, make_split(1_000, seed=2), config, checkpoints, "artifacts-test")
    return model.to("cpu").eval()


def _register(registry: ModelRegistry, log) -> tuple[str, str]:
    """Run `log()` inside a new run of the fraud experiment; register the run's `model`: (run id, version)."""
    with mlflow.start_run() as run:
        log()
    return run.info.run_id, registry.register(run.info.run_id, "model")


def _tampered_weights(kind: str, marker: Path) -> bytes:
    buffer = io.BytesIO()
    if kind == "torch.save with an object":
        torch.save({"mlp.0.weight": torch.zeros(2), "extra": Payload(marker)}, buffer)
    else:
        pickle.dump(Payload(marker), buffer)
    return buffer.getvalue()


def test_a_trained_model_round_trips_as_weights(tracking, trained):
    registry, _ = tracking
    x = make_split(500, seed=3).x
    with torch.no_grad():
        expected = trained(x)
    signature = infer_signature(x[:5].numpy(), expected[:5].numpy())
    run_id, version = _register(
        registry,
        lambda: log_model(
            trained, "model", signature=signature, input_example=x[:5].numpy(), pip_requirements=[]
        ),
    )
    uri = f"models:/{registry.name}/{version}"

    folder = Path(mlflow.artifacts.download_artifacts(uri))
    assert {p.name for p in (folder / MODEL_WEIGHTS_PATH).iterdir()} == {WEIGHTS_FILE, CONFIG_FILE}
    assert not [p for p in folder.rglob("*") if p.suffix in {".pkl", ".pth", ".pt2"}]
    assert mlflow.models.get_model_info(uri).signature == signature  # what the MLflow UI shows

    for loaded in (registry.load(version), load_model(f"runs:/{run_id}/model")):
        assert isinstance(loaded, FraudMLP) and not loaded.training
        assert loaded.config.to_dict() == trained.config.to_dict()
        with torch.no_grad():
            assert torch.equal(loaded(x), expected)
    served = mlflow.pyfunc.load_model(uri).predict(x.numpy())  # the pyfunc flavor, same loader
    assert torch.equal(torch.from_numpy(served), expected)


@pytest.mark.parametrize("kind", ["torch.save with an object", "a bare pickle"])
def test_a_weights_file_that_is_a_pickle_is_refused_and_never_run(tracking, trained, tmp_path, kind):
    registry, marker = tracking
    folder = save_weights(trained, tmp_path / "weights")
    (folder / WEIGHTS_FILE).write_bytes(_tampered_weights(kind, marker))
    run_id, version = _register(
        registry,
        lambda: mlflow.pyfunc.log_model(
            name="model", loader_module="training.artifacts", data_path=str(folder), pip_requirements=[]
        ),
    )

    with pytest.raises(ModelArtifactError) as refused:
        registry.load(version)
    message = str(refused.value)
    assert f"models:/{registry.name}/{version}" in message
    assert f"refused to load {MODEL_WEIGHTS_PATH}/{WEIGHTS_FILE}" in message
    assert "Unsupported" in message and "weights_only" not in message  # what was refused, no unsafe advice
    assert "retrain" in message and "re-log the model as weights" in message
    with pytest.raises(ModelArtifactError, match=f"runs:/{run_id}/model"):
        load_model(f"runs:/{run_id}/model")  # what the evaluate step reads
    with pytest.raises(ModelArtifactError, match="refused to load"):
        mlflow.pyfunc.load_model(f"models:/{registry.name}/{version}")
    assert not marker.exists(), "a loader ran code from the model artifact"


def test_a_model_pickled_by_mlflow_pytorch_is_refused_and_never_run(tracking):
    registry, marker = tracking
    run_id, version = _register(
        registry,
        lambda: mlflow.pytorch.log_model(
            PickledModule(marker), name="model", serialization_format="pickle", pip_requirements=[]
        ),
    )
    assert not marker.exists()  # logging pickled it; nothing has been unpickled yet

    with pytest.raises(ModelArtifactError) as refused:
        registry.load(version)
    message = str(refused.value)
    assert f"models:/{registry.name}/{version}: refused to load data/model.pth" in message
    assert "logged by mlflow.pytorch as a pickle" in message and "retrain" in message
    with pytest.raises(ModelArtifactError, match=f"runs:/{run_id}/model"):
        load_model(f"runs:/{run_id}/model")
    # MLflow's own loaders refuse it too: `configure` switched pickle deserialization off
    for load in (mlflow.pytorch.load_model, mlflow.pyfunc.load_model):
        with pytest.raises(MlflowException, match="pickle is disallowed"):
            load(f"models:/{registry.name}/{version}")
    assert not marker.exists(), "a loader ran code from the model artifact"


def test_weights_that_do_not_fit_their_config_are_refused(tracking, trained, tmp_path):
    registry, _ = tracking
    folder = save_weights(trained, tmp_path / "weights")
    wider = FraudMLP(type(trained.config)(hidden=(256, 64)))
    torch.save(wider.state_dict(), folder / WEIGHTS_FILE)
    _, version = _register(
        registry,
        lambda: mlflow.pyfunc.log_model(
            name="model", loader_module="training.artifacts", data_path=str(folder), pip_requirements=[]
        ),
    )
    with pytest.raises(ModelArtifactError, match="do not fit the model its config describes"):
        registry.load(version)
