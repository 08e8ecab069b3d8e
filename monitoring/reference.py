"""The champion's training reference: its train split's inputs and the scores it gives them.

Version -> its MLflow run -> the run's `lineage.training_set_rev` -> the train split of that training set
(read in place by DVC revision, training/dataset.py) -> the model inputs, categorical codes decoded back
to their values, plus the version's offline scores of those rows.

Scored with the version's ONNX export, the file the scoring service serves (serving.models.ModelSource:
the export's choice among fp32, int8, pruned and student; `onnx/model.onnx` is written for every registered
version): onnxruntime loads in a fraction of a second where torch takes seconds to import, and live scores
and reference scores then come from the same model. A version without an export (its export step failed)
is scored by its torch weights through the registry instead; `Reference.scorer` says which.

The train split of a sampled set (training/dataset.py: every fraud kept, legitimate rows at a rate) is
not the population: frauds are over-represented by 1 / rate. The reference keeps each fraud with
probability `rate` (seeded, so the same set gives the same reference), which restores the population's
mix, then at most MAX_REFERENCE_ROWS rows (drift tests need thousands, not millions).

Cached per version under `$MLOPS_HOME/monitoring/reference/` (Parquet plus a JSON of its provenance):
a champion is checked daily and its reference never changes. Where that folder cannot be written (the
cluster's step pods mount the shared volume read-only) the reference is rebuilt each time, with a warning.
"""

from __future__ import annotations

import errno
import json
import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.errors import PipelineError
from model_contract.inputs import CATEGORICAL_VOCAB, MODEL_INPUTS, NUMERIC_FEATURES, MissingInputsError
from training.dataset import LABEL, WEIGHT, read_training_set

if TYPE_CHECKING:
    import pandas as pd

    from core.settings import Settings

log = logging.getLogger(__name__)

SCORE = "score"
UNKNOWN = "<unknown>"  # a categorical value outside the model's vocabulary (its code 0)
MAX_REFERENCE_ROWS = 200_000
REFERENCE_FORMAT = 1  # bump when the cached file's content changes meaning
ONNX_ARTIFACT = "onnx/model.onnx"
TRAINING_SET_TAG = "lineage.training_set_rev"  # training/tracking.py Lineage
SEED = 7


class ReferenceUnavailableError(PipelineError):
    """The champion's training reference cannot be read; the message says why and what to do."""


@dataclass(frozen=True)
class Scorer:
    """A registered version as a function of its own input matrix (float32, `inputs` order: the names it
    was trained on; `model_matrix(frame, scorer.inputs)` builds it)."""

    version: str
    kind: str  # "onnx" | "torch"
    score: Callable[[np.ndarray], np.ndarray]
    inputs: tuple[str, ...] = MODEL_INPUTS


@dataclass(frozen=True)
class Reference:
    """The reference of one version: NUMERIC_FEATURES, CATEGORICAL_FEATURES (values) and SCORE."""

    version: str
    training_set_rev: str
    frame: pd.DataFrame
    scorer: str
    cached: bool  # read from the cache rather than built

    @property
    def rows(self) -> int:
        return len(self.frame)


def decode_categories(frame: pd.DataFrame) -> pd.DataFrame:
    """The categorical values of `frame`'s `<column>_code` columns (0, unknown: UNKNOWN); a new frame."""
    import pandas as pd

    out = pd.DataFrame(index=frame.index)
    for column, vocab in CATEGORICAL_VOCAB.items():
        names = np.array([UNKNOWN, *vocab], dtype=object)
        codes = frame[f"{column}_code"].to_numpy(dtype="float64")
        known = ~np.isnan(codes) & (codes >= 0) & (codes < len(names))
        values = np.full(len(codes), None, dtype=object)
        values[known] = names[codes[known].astype(int)]
        out[column] = values
    return out


def categories_as_the_model_sees_them(frame: pd.DataFrame) -> pd.DataFrame:
    """Raw categorical values (a scoring log's) with those outside the vocabulary as UNKNOWN, nulls kept:
    the same categories the reference has. Returns the categorical columns only, as a new frame."""
    import pandas as pd

    out = pd.DataFrame(index=frame.index)
    for column, vocab in CATEGORICAL_VOCAB.items():
        values = frame[column].astype("object")
        out[column] = values.where(values.isin(vocab) | values.isna(), UNKNOWN)
    return out


def model_matrix(frame: pd.DataFrame, inputs: Sequence[str] = MODEL_INPUTS) -> np.ndarray:
    """`inputs` (a version's, by name) of a frame that has them (numeric features and `<column>_code`),
    float32, NaN missing; raises MissingInputsError naming the ones the frame lacks."""
    lacking = [name for name in inputs if name not in frame]
    if lacking:
        raise MissingInputsError(
            f"the rows to score lack the version's input(s) {', '.join(lacking)}", lacking
        )
    return frame[list(inputs)].to_numpy(dtype="float32", na_value=float("nan"))


def version_scorer(settings: Settings, version: str) -> Scorer:
    """The registered version as a scorer: its ONNX export where it has one, else its torch weights."""
    from training.registry import ModelRegistry, model_inputs_of

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, version).run_id
    assert run_id is not None, "versions are registered from training runs"
    exported = {a.path for a in registry.client.list_artifacts(run_id, "onnx")}
    if ONNX_ARTIFACT in exported:
        from serving.models import ModelSource

        # The file the scoring service serves (the export's choice: fp32, int8, pruned or student), so the
        # reference scores and the live scores come from the same model.
        with tempfile.TemporaryDirectory() as scratch:
            served = ModelSource(settings.mlflow_tracking_uri, cache_dir=Path(scratch)).load(version)
        return Scorer(version, "onnx", served.score_own, served.inputs)
    log.warning("v%s has no %s in run %s: scoring it with its torch weights", version, ONNX_ARTIFACT, run_id)
    model = registry.load(version)

    def torch_scores(x: np.ndarray) -> np.ndarray:
        import torch

        from training.loop import predict

        return predict(model, torch.from_numpy(x)).numpy().reshape(-1)

    return Scorer(version, "torch", torch_scores, model_inputs_of(model))


def population_sample(frame: pd.DataFrame, negative_sample_rate: float, max_rows: int) -> pd.DataFrame:
    """Rows of a (possibly sampled) train split in the population's mix: each fraud kept with probability
    `negative_sample_rate` (the rate legitimate rows were kept at), then at most `max_rows` rows, both
    drawn with a fixed seed. Returns a new frame; `frame` is not changed."""
    rng = np.random.default_rng(SEED)
    keep = np.ones(len(frame), dtype=bool)
    if negative_sample_rate < 1.0 and LABEL in frame:
        fraud = frame[LABEL].to_numpy() == 1
        keep &= ~fraud | (rng.random(len(frame)) < negative_sample_rate)
    kept = frame[keep]
    if len(kept) > max_rows:
        kept = kept.iloc[np.sort(rng.choice(len(kept), size=max_rows, replace=False))]
    return kept.reset_index(drop=True)


def build_reference(settings: Settings, version: str, training_set_rev: str) -> Reference:
    """The reference of `version`, built from its training set (no cache)."""
    scorer = version_scorer(settings, version)
    # The version's own inputs (a champion trained before a feature was declared has no column of it): drift
    # compares what the version takes.
    frame = read_training_set(settings, training_set_rev, "train", [*scorer.inputs, LABEL, WEIGHT])
    sample = population_sample(frame, float(frame.attrs.get("negative_sample_rate", 1.0)), MAX_REFERENCE_ROWS)
    reference = sample[[name for name in NUMERIC_FEATURES if name in scorer.inputs]].astype("float64")
    reference = reference.join(decode_categories(sample))
    reference[SCORE] = scorer.score(model_matrix(sample, scorer.inputs)).astype("float64")
    return Reference(version, training_set_rev, reference, scorer.kind, cached=False)


def reference_dir(settings: Settings) -> Path:
    return settings.monitoring_dir / "reference"


def load_reference(settings: Settings, version: str) -> Reference:
    """The reference of registered `version`, from the cache when it holds this version's (same training
    set, same format), else built and cached."""
    import pandas as pd

    from training.registry import ModelRegistry

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, version).run_id
    assert run_id is not None, "versions are registered from training runs"
    rev = registry.client.get_run(run_id).data.tags.get(TRAINING_SET_TAG)
    if not rev:
        raise ReferenceUnavailableError(
            f"{registry.name} v{version} (run {run_id}) has no {TRAINING_SET_TAG} tag, so its training set "
            "is unknown and there is no reference to compare traffic with; register versions from "
            "training runs (`python -m training train`, then `register`)"
        )
    folder = reference_dir(settings)
    data, meta = folder / f"{registry.name}-v{version}.parquet", folder / f"{registry.name}-v{version}.json"
    provenance = {"version": version, "training_set_rev": rev, "format": REFERENCE_FORMAT}
    if meta.is_file() and data.is_file():
        recorded = json.loads(meta.read_text())
        if {k: recorded.get(k) for k in provenance} == provenance:
            return Reference(version, rev, pd.read_parquet(data), recorded["scorer"], cached=True)
    reference = build_reference(settings, version, rev)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        scratch = folder / f".{data.name}.tmp"
        reference.frame.to_parquet(scratch, index=False)
        scratch.replace(data)
        scratch = folder / f".{meta.name}.tmp"
        scratch.write_text(
            json.dumps({**provenance, "scorer": reference.scorer, "rows": reference.rows}, sort_keys=True)
        )
        scratch.replace(meta)  # last: a reader trusts the data only once its provenance is there
    except OSError as exc:
        if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        log.warning("reference of v%s not cached: %s is not writable here (%s)", version, folder, exc)
    return reference
