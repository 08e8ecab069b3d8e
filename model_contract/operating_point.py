"""A version's operating point: the decision threshold chosen for it on its holdout, for a stated target.

One global threshold for every version lets each promotion move the decline rate unseen: a better-ranking
model whose scores sit higher declines more transactions at the same 0.5. So at training (the evaluate step)
the threshold is chosen on the holdout for the target the settings state, `training.decline_rate`: the
share of transactions (by population weight: the holdout's negatives are sampled) the model may decline,
an alert budget in other words (1% = 10 declines per 1,000 transactions). The threshold is the lowest
score at which no more than that share is declined; precision and recall at it are recorded beside it. With
`training.review_rate` > 0 a second, lower threshold marks a review band: scores between the two are
neither approved nor declined but sent to review, at most that further share.

The point is logged on the run (metrics `operating_point_*`), copied to the registered version's tags
(`operating_point.*`, `register`), and read by the scoring service when it loads the version: champion and
shadow each decide at their own. A version registered before this has none: it decides at
`serving.threshold`, as before. The gate compares the decline rates of candidate and champion, each at its
own threshold, on the same holdout transactions, and refuses a change beyond `gate.max_decline_rate_change`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

TAG_PREFIX = "operating_point."
METRIC_PREFIX = "operating_point_"
FIELDS = ("threshold", "review_threshold", "target_decline_rate", "decline_rate", "precision", "recall")


@dataclass(frozen=True)
class OperatingPoint:
    threshold: float  # decline at or above
    review_threshold: float | None  # review at or above (below `threshold`); None: no review band
    target_decline_rate: float  # what it was chosen for
    decline_rate: float  # what it declines on the holdout (population-weighted)
    precision: float  # of the declines, the fraud share
    recall: float  # of the fraud, the share declined

    def tags(self) -> dict[str, str]:
        return {f"{TAG_PREFIX}{k}": repr(v) for k, v in asdict(self).items() if v is not None}

    def metrics(self) -> dict[str, float]:
        return {f"{METRIC_PREFIX}{k}": float(v) for k, v in asdict(self).items() if v is not None}


def threshold_for_rate(scores: np.ndarray, rate: float, weights: np.ndarray | None = None) -> float:
    """The lowest threshold t such that the (weighted) share of `scores` >= t is at most `rate`; above the
    highest score (nothing declined) when even the highest score's share is over it."""
    if not 0.0 < rate < 1.0:
        raise ValueError(f"a rate between 0 and 1 (exclusive), not {rate}")
    scores = np.asarray(scores, dtype="float64")
    if scores.size == 0 or not np.all(np.isfinite(scores)):
        raise ValueError("scores must be finite and not empty to choose a threshold on")
    w = np.ones_like(scores) if weights is None else np.asarray(weights, dtype="float64")
    order = np.argsort(-scores, kind="stable")
    ranked, mass = scores[order], np.cumsum(w[order]) / w.sum()
    # Only the last row of each run of equal scores is a possible cut: a threshold takes all ties or none.
    last_of_value = np.append(ranked[1:] != ranked[:-1], True)
    allowed = np.flatnonzero(last_of_value & (mass <= rate + 1e-12))
    if allowed.size == 0:
        return float(np.nextafter(ranked[0], math.inf))
    return float(ranked[allowed[-1]])


def decline_rate(scores: np.ndarray, threshold: float, weights: np.ndarray | None = None) -> float:
    """The (weighted) share of `scores` at or above `threshold`; a score that is not a number is declined."""
    scores = np.asarray(scores, dtype="float64")
    declined = ~(scores < threshold)  # NaN compares false: declined, as the service does
    w = np.ones_like(scores) if weights is None else np.asarray(weights, dtype="float64")
    return float(w[declined].sum() / w.sum()) if w.sum() else 0.0


def precision_recall(
    labels: np.ndarray, scores: np.ndarray, threshold: float, weights: np.ndarray | None = None
) -> tuple[float, float]:
    """(precision, recall) of declining at or above `threshold`, weighted; NaN where undefined (nothing
    declined, no fraud)."""
    w = np.ones(len(scores)) if weights is None else np.asarray(weights, dtype="float64")
    y = np.asarray(labels).astype(bool)
    declined = np.asarray(scores) >= threshold
    caught, flagged, fraud = w[declined & y].sum(), w[declined].sum(), w[y].sum()
    return (
        float(caught / flagged) if flagged else math.nan,
        float(caught / fraud) if fraud else math.nan,
    )


def choose(
    labels: np.ndarray,
    scores: np.ndarray,
    target_decline_rate: float,
    review_rate: float = 0.0,
    weights: np.ndarray | None = None,
) -> OperatingPoint:
    """The operating point of a model whose holdout scores are `scores` (see the module docstring)."""
    threshold = threshold_for_rate(scores, target_decline_rate, weights)
    review = (
        min(threshold_for_rate(scores, min(target_decline_rate + review_rate, 0.999), weights), threshold)
        if review_rate > 0
        else None
    )
    precision, recall = precision_recall(labels, scores, threshold, weights)
    return OperatingPoint(
        threshold=threshold,
        review_threshold=review,
        target_decline_rate=target_decline_rate,
        decline_rate=decline_rate(scores, threshold, weights),
        precision=0.0 if math.isnan(precision) else precision,
        recall=0.0 if math.isnan(recall) else recall,
    )


class OperatingPointTagError(ValueError):
    """A version's operating-point tags that cannot be a threshold (edited by hand in MLflow?): named."""


def from_tags(tags: dict[str, str] | None) -> OperatingPoint | None:
    """The point a registered version's tags record; None for a version registered without one. Raises
    OperatingPointTagError for tags that are not a usable threshold (anyone who can edit the version's tags
    in MLflow can write them): a threshold in (0, 1], a review threshold at most it."""
    tags = tags or {}
    if f"{TAG_PREFIX}threshold" not in tags:
        return None
    values: dict[str, float | None] = {}
    for name in FIELDS:
        raw = tags.get(f"{TAG_PREFIX}{name}")
        try:
            values[name] = float(raw) if raw not in (None, "", "None") else None
        except ValueError:
            raise OperatingPointTagError(f"tag {TAG_PREFIX}{name} is {raw!r}, not a number") from None
    threshold, review = values["threshold"], values["review_threshold"]
    top = float(np.nextafter(1.0, math.inf))  # above every score: declines nothing
    if threshold is None or not (0.0 < threshold <= top):
        raise OperatingPointTagError(f"tag {TAG_PREFIX}threshold is {threshold!r}, not in (0, 1]")
    if review is not None and not (0.0 < review <= threshold):
        raise OperatingPointTagError(
            f"tag {TAG_PREFIX}review_threshold is {review!r}, not in (0, {threshold}] (the threshold)"
        )
    return OperatingPoint(
        threshold=threshold,
        review_threshold=review,
        target_decline_rate=values["target_decline_rate"] or 0.0,
        decline_rate=values["decline_rate"] or 0.0,
        precision=values["precision"] or 0.0,
        recall=values["recall"] or 0.0,
    )


def from_metrics(metrics: dict[str, float]) -> OperatingPoint | None:
    """The point the evaluate step logged on a run (its `operating_point_*` metrics); None without one."""
    return from_tags({f"{TAG_PREFIX}{k.removeprefix(METRIC_PREFIX)}": repr(v) for k, v in metrics.items()
                      if k.startswith(METRIC_PREFIX)})  # fmt: skip
