"""A label-free estimate of the champion's performance from the first day: confidence-based performance
estimation (CBPE, as NannyML describes it), written here since NannyML does not resolve with this lock.

**Calibration first.** CBPE reads a calibrated score as the probability that the transaction is fraud. The
champion's holdout (its training set's, weighted back to the population where it was sampled) says whether
its scores are: the expected calibration error (ECE, equal-mass bins, weighted). Above
`monitoring.max_calibration_error` the scores are recalibrated by isotonic regression fitted on that holdout
(scikit-learn's IsotonicRegression), and the ECE after it is measured by two-fold cross-fitting, not on the
rows it was fitted to. The result is cached per version (`<monitoring>/calibration/`; where that cannot be
written, as in the cluster's read-only step pods, it is fitted each check).

**The estimate of a day's traffic**, from its calibrated probabilities p and scores s:
- AUC-PR: the mean average precision over `monitoring.estimate_samples` draws of labels y ~ Bernoulli(p),
  each ranked by s (training/metrics.py's average precision), with the spread of the draws;
- recall at the decision threshold t (the champion's own: its operating point, else `serving.threshold`):
  sum(p where s >= t) / sum(p).
It holds while the probability of fraud given the score stays what it was on the holdout (a shift in who
transacts, not in what fraud looks like to the model); a change of that kind is what the realised figure,
once labels mature, shows and the estimate cannot. The check logs both, with the estimate's error.

**Its own warning.** What the calibrated probabilities add up to is the fraud rate they imply. When that is
more than `monitoring.max_implied_fraud_rate_ratio` times the holdout's (or less than its inverse), either
fraud surged or the scores no longer mean what they meant: the estimate is marked unreliable and the check
alerts. On the generator's drift fault (amounts x2.5, online) the scores rise on legitimate rows, the
implied rate goes up by about half and the estimate overstates the realised AUC-PR (the figures are in
docs/operations.md, "Monitoring"): the mark is how that shows on the day, before any label.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Calibration:
    version: str
    method: str  # identity | isotonic
    ece_before: float
    ece_after: float  # of what is applied (identity: the same; isotonic: cross-fitted)
    holdout_auc_pr: float  # the version's weighted holdout AUC-PR: what the estimate is compared with
    holdout_rows: int
    holdout_fraud_rate: float  # weighted: the population's
    x: tuple[float, ...] = ()  # the isotonic map's knots (scores -> probabilities)
    y: tuple[float, ...] = ()

    def apply(self, scores: np.ndarray) -> np.ndarray:
        scores = np.asarray(scores, dtype="float64")
        if self.method == "identity":
            return np.clip(scores, 0.0, 1.0)
        return np.interp(scores, np.asarray(self.x), np.asarray(self.y))


@dataclass(frozen=True)
class Estimate:
    rows: int
    auc_pr: float | None  # None: no rows
    auc_pr_spread: float | None  # the standard deviation over the draws
    recall_at_threshold: float | None
    expected_frauds: float
    threshold: float

    @property
    def implied_fraud_rate(self) -> float | None:
        return self.expected_frauds / self.rows if self.rows else None

    def to_dict(self) -> dict:
        return {**asdict(self), "implied_fraud_rate": self.implied_fraud_rate}


def reliability(estimated: Estimate, fitted: Calibration, max_ratio: float) -> tuple[bool, str]:
    """Whether the fraud rate the day's probabilities imply is within `max_ratio` of the holdout's."""
    implied = estimated.implied_fraud_rate
    if implied is None or fitted.holdout_fraud_rate <= 0:
        return True, "no rate to compare"
    ratio = implied / fitted.holdout_fraud_rate
    figures = (
        f"the calibrated scores imply a fraud rate of {implied:.4%} ({estimated.expected_frauds:.0f} of "
        f"{estimated.rows}), {ratio:.2f} times the holdout's {fitted.holdout_fraud_rate:.4%}"
    )
    if 1 / max_ratio <= ratio <= max_ratio:
        return True, figures
    return False, (
        f"{figures}: beyond {max_ratio}x, so either fraud surged or the scores no longer mean what they "
        "meant on the holdout; the estimate is unreliable until labels confirm it"
    )


def expected_calibration_error(
    labels: np.ndarray, probabilities: np.ndarray, weights: np.ndarray | None = None, bins: int = 10
) -> float:
    """Weighted mean |observed fraud rate - mean probability| over equal-mass bins of the probabilities."""
    labels = np.asarray(labels, dtype="float64")
    probabilities = np.asarray(probabilities, dtype="float64")
    weights = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype="float64")
    order = np.argsort(probabilities, kind="stable")
    cumulative = np.cumsum(weights[order])
    edges = np.searchsorted(cumulative, np.linspace(0, cumulative[-1], bins + 1)[1:-1], side="right")
    total, error = weights.sum(), 0.0
    for part in np.split(order, edges):
        if len(part):
            w = weights[part]
            gap = abs(np.average(labels[part], weights=w) - np.average(probabilities[part], weights=w))
            error += w.sum() / total * gap
    return float(error)


def _isotonic(scores: np.ndarray, labels: np.ndarray, weights: np.ndarray):
    from sklearn.isotonic import IsotonicRegression

    return IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(
        scores, labels, sample_weight=weights
    )


def fit_calibration(
    version: str, scores: np.ndarray, labels: np.ndarray, weights: np.ndarray | None, max_error: float
) -> Calibration:
    """The calibration of `version` from its holdout scores and labels (pure; see the module docstring)."""
    from training.metrics import average_precision

    scores = np.asarray(scores, dtype="float64")
    labels = np.asarray(labels, dtype="float64")
    weights = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype="float64")
    before = expected_calibration_error(labels, np.clip(scores, 0, 1), weights)
    baseline = average_precision(labels.astype(int), scores, weights)
    rate = float(np.average(labels, weights=weights))
    if before <= max_error:
        return Calibration(version, "identity", before, before, baseline, len(labels), rate)
    half = np.random.default_rng(0).random(len(labels)) < 0.5
    crossed = np.empty(len(labels))
    for fit, held in ((half, ~half), (~half, half)):
        crossed[held] = _isotonic(scores[fit], labels[fit], weights[fit]).predict(scores[held])
    after = expected_calibration_error(labels, crossed, weights)
    model = _isotonic(scores, labels, weights)
    return Calibration(
        version,
        "isotonic",
        before,
        after,
        baseline,
        len(labels),
        rate,
        tuple(float(v) for v in model.X_thresholds_),
        tuple(float(v) for v in model.y_thresholds_),
    )


def calibration(settings: Settings, version: str) -> Calibration:
    """The version's calibration, fitted once from its holdout (scored as it serves) and cached."""
    from monitoring.reference import version_scorer
    from training.dataset import read_holdout
    from training.registry import ModelRegistry
    from training.tracking import training_set_rev

    path = settings.monitoring_dir / "calibration" / f"fraud-detector-v{version}.json"
    if path.is_file():
        stored = json.loads(path.read_text())
        return Calibration(**{**stored, "x": tuple(stored["x"]), "y": tuple(stored["y"])})
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, version).run_id
    assert run_id is not None, "versions are registered from training runs"
    scorer = version_scorer(settings, version)
    holdout = read_holdout(settings, training_set_rev(settings, run_id), scorer.inputs)
    scores = scorer.score(holdout.x).astype("float64")
    fitted = fit_calibration(
        version, scores, holdout.y, holdout.weights, settings.monitoring.max_calibration_error
    )
    log.info(
        "v%s calibration: ECE %.4f on its holdout; %s (ECE %.4f after)",
        version, fitted.ece_before, fitted.method, fitted.ece_after,
    )  # fmt: skip
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(asdict(fitted)))
        temporary.replace(path)
    except OSError as exc:  # the cluster's step pods mount the shared volume read-only: fitted each check
        log.info("the calibration of v%s is not cached (%s): fitted again next time", version, exc)
    return fitted


def estimate(
    probabilities: np.ndarray, scores: np.ndarray, threshold: float, samples: int, seed: int
) -> Estimate:
    """CBPE of one day's traffic (pure; see the module docstring)."""
    from training.metrics import average_precision

    p = np.asarray(probabilities, dtype="float64")
    s = np.asarray(scores, dtype="float64")
    if not len(p):
        return Estimate(0, None, None, None, 0.0, threshold)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(samples):
        y = (rng.random(len(p)) < p).astype(int)
        if 0 < y.sum() < len(y):
            draws.append(average_precision(y, s))
    expected = float(p.sum())
    return Estimate(
        rows=len(p),
        auc_pr=float(np.mean(draws)) if draws else None,
        auc_pr_spread=float(np.std(draws)) if draws else None,
        recall_at_threshold=float(p[s >= threshold].sum() / expected) if expected > 0 else None,
        expected_frauds=expected,
        threshold=threshold,
    )
