"""The model as an MLflow artifact: weights and a config, never a pickle.

A logged model holds `data/weights/state_dict.pt` (the state dict: `torch.save` of tensors only) and
`data/weights/model_config.json` (the ModelConfig), next to MLflow's MLmodel with the signature and an input
example. `load_model` rebuilds FraudMLP from the config and reads the weights with
`torch.load(weights_only=True)`, whose unpickler accepts tensors and plain containers only: a weights file
that carries code (a pickle whose `__reduce__` calls something) is refused before anything runs. A model
logged the old way (`mlflow.pytorch`, a pickle of the whole module) is refused too, not unpickled.

Whoever can write a model artifact must not be able to run code in the process that loads it (an Airflow
worker holding credentials), so this module is the only reader of model artifacts, and it switches MLflow's
own pickle loading off (`MLFLOW_ALLOW_PICKLE_DESERIALIZATION=false`) in every process that loads or
configures models. The pyfunc flavor names this module as its loader (`loader_module`): serving with
`mlflow.pyfunc.load_model` takes the code from the installed package, not from the artifact, and loads
through the same path.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import PipelineError

if TYPE_CHECKING:
    import numpy as np
    from mlflow.models.model import ModelInfo

    from training.model import FraudMLP

WEIGHTS_DIR = "weights"  # MLflow copies it to data/weights in the logged model
WEIGHTS_FILE = "state_dict.pt"
CONFIG_FILE = "model_config.json"
MODEL_WEIGHTS_PATH = f"data/{WEIGHTS_DIR}"
PICKLE_SWITCH = "MLFLOW_ALLOW_PICKLE_DESERIALIZATION"
RELOG_HINT = (
    "retrain (`mlops retrain`, or `python -m training train`) or re-log the model as weights with "
    "training.artifacts.log_model, then register the new run"
)


class ModelArtifactError(PipelineError):
    """A model artifact that is not loaded: unsafe (a pickle) or incomplete; the message says what to do."""


def forbid_pickle_deserialization() -> None:
    """Make MLflow refuse to unpickle models in this process (its default allows it)."""
    os.environ[PICKLE_SWITCH] = "false"


def save_weights(model: FraudMLP, folder: Path) -> Path:
    """Write the model's state dict and config into `folder` (created); returns the folder."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().to("cpu") for key, value in model.state_dict().items()}
    torch.save(state, folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(json.dumps(model.config.to_dict(), indent=2, sort_keys=True))
    return folder


def log_model(
    model: FraudMLP,
    name: str,
    signature: Any = None,
    input_example: Any = None,
    pip_requirements: list[str] | None = None,
) -> ModelInfo:
    """Log `model` as weights to the active run: an MLflow logged model `name` (pyfunc flavor, loader
    `training.artifacts`), registrable as `runs:/<run_id>/<name>`."""
    import mlflow.pyfunc

    with tempfile.TemporaryDirectory() as scratch:
        folder = save_weights(model, Path(scratch) / WEIGHTS_DIR)
        return mlflow.pyfunc.log_model(
            name=name,
            loader_module=__name__,
            data_path=str(folder),
            signature=signature,
            input_example=input_example,
            pip_requirements=pip_requirements,
        )


def load_weights(folder: Path, source: str) -> FraudMLP:
    """Rebuild FraudMLP from `folder` (config and state dict); `source` names the model in errors."""
    import torch

    from training.model import FraudMLP, ModelConfig

    config_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    try:
        config = ModelConfig.from_dict(json.loads(config_path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise ModelArtifactError(
            f"{source}: unreadable model config {MODEL_WEIGHTS_PATH}/{CONFIG_FILE} ({exc}); {RELOG_HINT}"
        ) from exc
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise ModelArtifactError(
            f"{source}: refused to load {MODEL_WEIGHTS_PATH}/{WEIGHTS_FILE}: it is not a plain state dict of "
            f"tensors, and unpickling it could run code from the artifact ({_refusal(exc)}). "
            f"Nothing was loaded; {RELOG_HINT}"
        ) from None
    except (OSError, RuntimeError, EOFError) as exc:
        raise ModelArtifactError(
            f"{source}: unreadable weights {MODEL_WEIGHTS_PATH}/{WEIGHTS_FILE} ({exc}); {RELOG_HINT}"
        ) from exc
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelArtifactError(
            f"{source}: {MODEL_WEIGHTS_PATH}/{WEIGHTS_FILE} holds a {type(state).__name__}, not a state dict "
            f"of tensors; {RELOG_HINT}"
        )
    try:
        model = FraudMLP(config)
        model.load_state_dict(state, strict=True)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ModelArtifactError(
            f"{source}: the weights do not fit the model its config describes ({exc}); {RELOG_HINT}"
        ) from exc
    return model.eval()


def _refusal(exc: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler refused, without its advice to load the file unsafely."""
    _, found, detail = str(exc).partition("WeightsUnpickler error:")
    lines = [line.strip() for line in detail.splitlines() if line.strip()]
    return lines[0].split(". ")[0] if found and lines else type(exc).__name__


def load_model(uri: str) -> FraudMLP:
    """The FraudMLP at an MLflow model URI (`models:/<name>/<version>` or `runs:/<run_id>/<name>`), on CPU.

    Only weights and a JSON config are read: a pickled model (or a weights file that is one) is refused
    with ModelArtifactError and never unpickled."""
    import mlflow.artifacts

    forbid_pickle_deserialization()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=scratch))
        folder = root / MODEL_WEIGHTS_PATH
        if not (folder / WEIGHTS_FILE).is_file():
            if (root / "data" / "model.pth").is_file():
                raise ModelArtifactError(
                    f"{uri}: refused to load data/model.pth: the model was logged by mlflow.pytorch as a "
                    f"pickle, and unpickling it could run code from the artifact. Nothing was loaded; "
                    f"{RELOG_HINT}"
                )
            raise ModelArtifactError(
                f"{uri}: no weights at {MODEL_WEIGHTS_PATH}/{WEIGHTS_FILE} (found: "
                f"{sorted(p.name for p in root.iterdir())}); it was not logged by "
                f"training.artifacts.log_model; {RELOG_HINT}"
            )
        return load_weights(folder, uri)


class FraudPyfunc:
    """What `mlflow.pyfunc.load_model` returns for our models: probabilities for a float32 matrix."""

    def __init__(self, model: FraudMLP) -> None:
        self.model = model

    def predict(self, model_input: Any, params: dict | None = None) -> np.ndarray:
        import numpy as np
        import torch

        from training.loop import predict

        x = torch.from_numpy(np.asarray(model_input, dtype=np.float32))
        return predict(self.model, x).numpy()


def _load_pyfunc(data_path: str, model_config: dict | None = None) -> FraudPyfunc:
    """MLflow's pyfunc hook (`loader_module`): the same weights-only loading."""
    forbid_pickle_deserialization()
    return FraudPyfunc(load_weights(Path(data_path), data_path))
