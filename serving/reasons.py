"""A decision's reasons: the few inputs that moved its score most.

Occlusion against the version's baseline (model_contract/onnx.py BASELINE_METADATA, recorded by its export:
a numeric input's training mean, which the model's normalization centres on, and a categorical input's most
frequent code): for each input, the transaction is scored again with that input alone put back to its
baseline value; the input's effect is the score minus that score. A positive effect is how much its value
raised the fraud score above what an ordinary value would have given. The reasons are the inputs with the
largest positive effects, at most `serving.reason_count`, largest first; an approved transaction can still
have some (it was only further from the threshold).

Cost: one model call over (inputs x transactions) rows per explained batch, one ONNX run in all, so it is
paid once per batch, not per transaction; by default only the transactions not approved are explained
(`serving.reasons`). docs/benchmarks.md has the measured cost per explained transaction.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from serving.models import LoadedModel

EFFECT_DIGITS = 6


def explain(
    model: LoadedModel, x: np.ndarray, scores: np.ndarray, rows: list[int], count: int
) -> dict[int, list[dict[str, Any]]]:
    """Reasons of the transactions at `rows` of `x` (MODEL_INPUTS order, as the service builds it; `scores`
    the model's scores of all of `x`): {row: [{"input", "value", "baseline", "effect"}, ...]}. A row whose
    score is not finite gets none (a broken model explains nothing); a model without a baseline, none at all.
    """
    baseline = model.baseline
    wanted = [r for r in rows if math.isfinite(float(scores[r]))]
    if baseline is None or not wanted:
        return {}
    columns = model.columns
    own = x[wanted] if columns is None else x[np.ix_(wanted, columns)]
    n, k = own.shape
    reference = np.asarray(baseline, dtype=own.dtype)
    # k copies of each row, copy j with input j put back to its baseline
    occluded = np.repeat(own[:, None, :], k, axis=1)
    diagonal = np.arange(k)
    occluded[:, diagonal, diagonal] = reference
    moved = model.score_own(np.ascontiguousarray(occluded.reshape(n * k, k))).reshape(n, k)
    effects = scores[wanted][:, None] - moved
    out: dict[int, list[dict[str, Any]]] = {}
    rounded = np.round(effects, EFFECT_DIGITS)  # what is shown; an effect that rounds to nothing is none
    for i, row in enumerate(wanted):
        order = [j for j in np.argsort(-rounded[i], kind="stable") if rounded[i, j] > 0][:count]
        out[row] = [
            {
                "input": model.inputs[j],
                "value": None if math.isnan(float(own[i, j])) else float(own[i, j]),
                "baseline": float(reference[j]),
                "effect": float(rounded[i, j]),
            }
            for j in order
        ]
    return out


def as_text(reasons: list[dict[str, Any]] | None) -> str | None:
    """The scoring log's form: `input:+effect;...`, largest first (None: not explained)."""
    if reasons is None:
        return None
    return ";".join(f"{r['input']}:{r['effect']:+.{EFFECT_DIGITS}f}" for r in reasons)
