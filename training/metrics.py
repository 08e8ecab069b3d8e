"""Evaluation: the gate's metrics and the pictures MLflow keeps. Pure functions over arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PRIMARY_METRIC = "auc_pr"


def average_precision(labels: np.ndarray, scores: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Area under the precision-recall curve (average precision); 0.0 when there is no positive. `weights`:
    how many rows of the population each row stands for (a sampled holdout, training/dataset.py)."""
    from sklearn.metrics import average_precision_score

    if labels.sum() == 0:
        return 0.0
    return float(average_precision_score(labels, scores, sample_weight=weights))


def recall_at_fpr(
    labels: np.ndarray, scores: np.ndarray, fpr: float, weights: np.ndarray | None = None
) -> float:
    """The share of positives (by weight) scored above the threshold that flags `fpr` of the negatives (by
    weight)."""
    negative, positive = labels == 0, labels == 1
    if not positive.any() or not negative.any():
        return 0.0
    if weights is None:
        threshold = np.quantile(scores[negative], 1.0 - fpr, method="higher")
        return float((scores[positive] > threshold).mean())
    weights = np.asarray(weights, dtype=float)
    order = np.argsort(scores[negative], kind="stable")
    ranked, mass = scores[negative][order], np.cumsum(weights[negative][order])
    # the lowest score with at least 1 - fpr of the negatives' weight at or below it
    threshold = ranked[min(np.searchsorted(mass, (1.0 - fpr) * mass[-1]), len(ranked) - 1)]
    caught = scores[positive] > threshold
    return float(np.average(caught, weights=weights[positive]))


def evaluate(
    labels: np.ndarray, scores: np.ndarray, threshold: float = 0.5, weights: np.ndarray | None = None
) -> dict[str, float]:
    """AUC-PR (primary), ROC AUC, recall at a 1% false-positive rate (the fraud caught when alerting on 1% of
    legitimate transactions: threshold-free, so it compares models whatever their calibration), and
    precision/recall/F1 and the Brier score at `threshold`; each row counted `weights` times (default 1)."""
    from sklearn.metrics import brier_score_loss, f1_score, precision_score, recall_score, roc_auc_score

    labels = labels.astype(int)
    non_finite = int(np.count_nonzero(~np.isfinite(scores)))
    if non_finite:
        # A diverged model: the metrics are NaN (the gate refuses them) instead of scikit-learn's
        # "Input contains NaN" from deep inside a step.
        nan = float("nan")
        names = (PRIMARY_METRIC, "roc_auc", "recall_at_1pct_fpr", "precision", "recall", "f1", "brier")
        return {
            **dict.fromkeys(names, nan),
            "non_finite_scores": float(non_finite),
            "positives": float(labels.sum()),
            "rows": float(len(labels)),
            "population_rows": float(len(labels) if weights is None else np.sum(weights)),
        }
    predicted = (scores >= threshold).astype(int)
    both_classes = 0 < labels.sum() < len(labels)
    counted = {"sample_weight": weights}
    return {
        PRIMARY_METRIC: average_precision(labels, scores, weights),
        "roc_auc": float(roc_auc_score(labels, scores, **counted)) if both_classes else 0.5,
        "recall_at_1pct_fpr": recall_at_fpr(labels, scores, 0.01, weights),
        "precision": float(precision_score(labels, predicted, zero_division=0, **counted)),
        "recall": float(recall_score(labels, predicted, zero_division=0, **counted)),
        "f1": float(f1_score(labels, predicted, zero_division=0, **counted)),
        "brier": float(brier_score_loss(labels, scores, **counted)),
        "positives": float(labels.sum()),
        "rows": float(len(labels)),
        "population_rows": float(len(labels) if weights is None else np.sum(weights)),
    }


def plot_evaluation(
    labels: np.ndarray,
    scores: np.ndarray,
    folder: Path,
    threshold: float = 0.5,
    weights: np.ndarray | None = None,
) -> list[Path]:
    """PR curve, ROC curve, confusion matrix and calibration, each a PNG in `folder`."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never a display
    import matplotlib.pyplot as plt
    from sklearn.calibration import calibration_curve
    from sklearn.metrics import confusion_matrix, precision_recall_curve, roc_curve

    folder.mkdir(parents=True, exist_ok=True)
    labels = labels.astype(int)
    paths = []

    def save(fig, name: str) -> None:
        path = folder / name
        fig.savefig(path, dpi=90, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)

    precision, recall, _ = precision_recall_curve(labels, scores, sample_weight=weights)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(recall, precision)
    ax.axhline(np.average(labels, weights=weights), linestyle="--", color="grey", label="base rate")
    ax.set(
        xlabel="recall",
        ylabel="precision",
        title=f"PR curve (AUC-PR {average_precision(labels, scores, weights):.3f})",
    )
    ax.legend()
    save(fig, "pr_curve.png")

    fpr, tpr, _ = roc_curve(labels, scores, sample_weight=weights)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(fpr, tpr)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC curve")
    save(fig, "roc_curve.png")

    matrix = confusion_matrix(labels, (scores >= threshold).astype(int), labels=[0, 1], sample_weight=weights)
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(matrix, cmap="Blues")
    for (row, col), value in np.ndenumerate(matrix):
        ax.text(col, row, f"{value:.0f}", ha="center", va="center")
    ax.set(
        xticks=[0, 1], yticks=[0, 1], xlabel="predicted", ylabel="actual", title=f"confusion @ {threshold}"
    )
    save(fig, "confusion_matrix.png")

    fraction, mean_score = calibration_curve(labels, scores, n_bins=10, strategy="quantile")
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(mean_score, fraction, marker="o")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    title = "calibration" if weights is None else "calibration (sampled rows, unweighted)"
    ax.set(xlabel="mean predicted probability", ylabel="fraction of fraud", title=title)
    save(fig, "calibration.png")
    return paths
