"""Evaluation: the gate's metrics and the pictures MLflow keeps. Pure functions over arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

PRIMARY_METRIC = "auc_pr"


def average_precision(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the precision-recall curve (average precision); 0.0 when there is no positive."""
    from sklearn.metrics import average_precision_score

    if labels.sum() == 0:
        return 0.0
    return float(average_precision_score(labels, scores))


def recall_at_fpr(labels: np.ndarray, scores: np.ndarray, fpr: float) -> float:
    """The share of positives scored above the threshold that flags `fpr` of the negatives."""
    negatives, positives = scores[labels == 0], scores[labels == 1]
    if len(positives) == 0 or len(negatives) == 0:
        return 0.0
    threshold = np.quantile(negatives, 1.0 - fpr, method="higher")
    return float((positives > threshold).mean())


def evaluate(labels: np.ndarray, scores: np.ndarray, threshold: float = 0.5) -> dict[str, float]:
    """AUC-PR (primary), ROC AUC, recall at a 1% false-positive rate (the fraud caught when alerting on 1% of
    legitimate transactions: threshold-free, so it compares models whatever their calibration), and
    precision/recall/F1 and the Brier score at `threshold`."""
    from sklearn.metrics import brier_score_loss, f1_score, precision_score, recall_score, roc_auc_score

    labels = labels.astype(int)
    predicted = (scores >= threshold).astype(int)
    both_classes = 0 < labels.sum() < len(labels)
    return {
        PRIMARY_METRIC: average_precision(labels, scores),
        "roc_auc": float(roc_auc_score(labels, scores)) if both_classes else 0.5,
        "recall_at_1pct_fpr": recall_at_fpr(labels, scores, 0.01),
        "precision": float(precision_score(labels, predicted, zero_division=0)),
        "recall": float(recall_score(labels, predicted, zero_division=0)),
        "f1": float(f1_score(labels, predicted, zero_division=0)),
        "brier": float(brier_score_loss(labels, scores)),
        "positives": float(labels.sum()),
        "rows": float(len(labels)),
    }


def plot_evaluation(
    labels: np.ndarray, scores: np.ndarray, folder: Path, threshold: float = 0.5
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

    precision, recall, _ = precision_recall_curve(labels, scores)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(recall, precision)
    ax.axhline(labels.mean(), linestyle="--", color="grey", label="base rate")
    ax.set(
        xlabel="recall",
        ylabel="precision",
        title=f"PR curve (AUC-PR {average_precision(labels, scores):.3f})",
    )
    ax.legend()
    save(fig, "pr_curve.png")

    fpr, tpr, _ = roc_curve(labels, scores)
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(fpr, tpr)
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set(xlabel="false positive rate", ylabel="true positive rate", title="ROC curve")
    save(fig, "roc_curve.png")

    matrix = confusion_matrix(labels, (scores >= threshold).astype(int), labels=[0, 1])
    fig, ax = plt.subplots(figsize=(4, 4))
    ax.imshow(matrix, cmap="Blues")
    for (row, col), value in np.ndenumerate(matrix):
        ax.text(col, row, str(value), ha="center", va="center")
    ax.set(
        xticks=[0, 1], yticks=[0, 1], xlabel="predicted", ylabel="actual", title=f"confusion @ {threshold}"
    )
    save(fig, "confusion_matrix.png")

    fraction, mean_score = calibration_curve(labels, scores, n_bins=10, strategy="quantile")
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.plot(mean_score, fraction, marker="o")
    ax.plot([0, 1], [0, 1], linestyle="--", color="grey")
    ax.set(xlabel="mean predicted probability", ylabel="fraction of fraud", title="calibration")
    save(fig, "calibration.png")
    return paths
