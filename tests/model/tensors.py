"""Tiny deterministic training data for model tests: a fraud-like signal in a few columns, rare positives,
some missing values, categorical codes in range."""

from __future__ import annotations

import torch

from training.dataset import CATEGORICAL_VOCAB, MODEL_INPUTS, NUMERIC_FEATURES
from training.loop import Tensors


def make_split(rows: int, seed: int, positive_rate: float = 0.05) -> Tensors:
    generator = torch.Generator().manual_seed(seed)
    numeric = torch.randn(rows, len(NUMERIC_FEATURES), generator=generator)
    codes = torch.stack(
        [torch.randint(0, len(v) + 1, (rows,), generator=generator) for v in CATEGORICAL_VOCAB.values()],
        dim=1,
    ).float()
    # fraud depends on two numeric columns and one category, through a noisy threshold
    score = 1.5 * numeric[:, 0] + numeric[:, 3] + (codes[:, 1] == 5).float() * 1.5
    score = score + 0.8 * torch.randn(rows, generator=generator)
    threshold = torch.quantile(score, 1 - positive_rate)
    labels = (score > threshold).float()
    # missing values, as an entity outside a view's TTL gives
    numeric[torch.rand(rows, generator=generator) < 0.1, 10] = float("nan")
    x = torch.cat([numeric, codes], dim=1)
    assert x.shape[1] == len(MODEL_INPUTS)
    return Tensors(x, labels)
