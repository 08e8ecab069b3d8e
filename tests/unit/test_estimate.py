"""The label-free estimate (monitoring/estimate.py) against reference computations: the calibration error
by hand, the recalibration on scores whose miscalibration is known, and the estimate against the mean of
the realised figures over labels drawn from the probabilities it assumes."""

from __future__ import annotations

import numpy as np
import pytest


def test_the_expected_calibration_error_by_hand():
    from monitoring.estimate import expected_calibration_error

    labels = np.array([0, 0, 1, 1])
    probabilities = np.array([0.1, 0.3, 0.6, 0.8])
    # two equal-mass bins: {0.1, 0.3} observed 0 vs mean 0.2; {0.6, 0.8} observed 1 vs mean 0.7
    assert expected_calibration_error(labels, probabilities, bins=2) == pytest.approx(0.5 * 0.2 + 0.5 * 0.3)
    weights = np.array([3.0, 1.0, 1.0, 1.0])  # the first row stands for three
    assert expected_calibration_error(labels, probabilities, weights, bins=1) == pytest.approx(
        abs(2 / 6 - (0.3 + 0.3 + 0.6 + 0.8) / 6)
    )


def test_calibrated_scores_are_kept_and_miscalibrated_ones_are_mapped_back():
    from monitoring.estimate import fit_calibration

    rng = np.random.default_rng(1)
    p = rng.beta(0.5, 20, size=40_000)
    labels = (rng.random(len(p)) < p).astype(int)
    kept = fit_calibration("1", p, labels, None, max_error=0.02)
    assert kept.method == "identity" and kept.ece_before < 0.02
    assert kept.holdout_fraud_rate == pytest.approx(labels.mean())
    inflated = p**0.3  # a model trained with a large positive weight: every score too high
    mapped = fit_calibration("2", inflated, labels, None, max_error=0.02)
    assert mapped.method == "isotonic" and mapped.ece_before > 0.2 and mapped.ece_after < 0.01
    back = mapped.apply(inflated)
    assert np.all(np.diff(mapped.apply(np.sort(inflated))) >= 0)  # monotone: the ranking is kept
    assert np.mean(np.abs(back - p)) < 0.01


def test_the_estimate_is_the_mean_of_the_realised_figures_when_the_probabilities_hold():
    from monitoring.estimate import estimate
    from training.metrics import average_precision

    rng = np.random.default_rng(2)
    p = rng.beta(0.5, 30, size=5_000)
    scores = p + rng.normal(0, 0.002, size=len(p))  # ranked by a noisy copy of the truth
    estimated = estimate(p, scores, threshold=0.05, samples=200, seed=3)
    realised, recalls = [], []
    for _ in range(300):  # the reference: labels drawn as the estimate assumes, figures computed plainly
        y = (rng.random(len(p)) < p).astype(int)
        realised.append(average_precision(y, scores))
        recalls.append(y[scores >= 0.05].sum() / y.sum())
    assert estimated.auc_pr == pytest.approx(np.mean(realised), abs=0.01)
    assert estimated.auc_pr_spread == pytest.approx(np.std(realised), rel=0.25)
    assert estimated.recall_at_threshold == pytest.approx(np.mean(recalls), abs=0.01)
    assert estimated.expected_frauds == pytest.approx(p.sum()) and estimated.rows == len(p)
    assert estimate(np.zeros(0), np.zeros(0), 0.5, 10, 1).auc_pr is None
