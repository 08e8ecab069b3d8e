"""A small training set in the pipeline's own layout, versioned by the real writer (DVC), for tests of the
training command that do not need the whole lake behind it: the pod test and the torchrun test."""

from __future__ import annotations

import json
from datetime import date

import numpy as np
import pandas as pd

from core.settings import Settings

AS_OF = date(2026, 3, 2)


def synthetic_training_frame(rows: int = 3000, seed: int = 11) -> pd.DataFrame:
    """Rows with every model input, a learnable label, the three splits in time order and weights."""
    from training.dataset import CATEGORICAL_VOCAB, LABEL, NUMERIC_FEATURES, SPLIT, WEIGHT

    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({name: rng.normal(size=rows).astype("float32") for name in NUMERIC_FEATURES})
    for column, vocab in CATEGORICAL_VOCAB.items():
        frame[f"{column}_code"] = rng.integers(0, len(vocab) + 1, size=rows).astype("float32")
    signal = frame[NUMERIC_FEATURES[0]] + 0.5 * frame[NUMERIC_FEATURES[1]]
    frame[LABEL] = (signal + rng.normal(scale=0.5, size=rows) > 1.6).astype("int64")
    position = np.arange(rows)
    frame[SPLIT] = np.where(
        position < rows * 0.7, "train", np.where(position < rows * 0.85, "validation", "holdout")
    )
    frame[WEIGHT] = 1.0
    frame["event_timestamp"] = pd.date_range("2026-02-01", periods=rows, freq="10min", tz="UTC")
    return frame


def versioned_training_set(settings: Settings, day: date = AS_OF) -> str:
    """Version a synthetic training set as of `day` with the pipeline's writer, and the gold validation
    record of that date as validate_gold leaves it; returns the revision."""
    from pipelines.gold.contract import validation_path
    from training.dataset import version_training_frame

    rev, _ = version_training_frame(settings, day, synthetic_training_frame(), {"window_days": 30})
    record = validation_path(settings.lake, day)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(
        json.dumps({"event_date": day.isoformat(), "results": [{"suite": "gold", "success": True}]})
    )
    return rev
