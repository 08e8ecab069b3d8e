"""Live performance: how the served scores (and the shadow challenger's) ranked the transactions whose
labels have matured.

A check of day D looks at the scoring log's event dates D - maturity - window_days + 1 .. D - maturity
(maturity: `training.label_maturity_days`, the same wait the training set applies, since younger
transactions' chargebacks have mostly not come in yet) and labels each transaction as the training set
does: fraud when a chargeback for it was reported before the end of D (silver labels, read by arrival
date as training/dataset.py reads them), legitimate otherwise. Per model version that served scores, and
per version that scored in shadow: AUC-PR and recall at a 1% false-positive rate (training/metrics.py),
with a verdict only from `monitoring.min_labelled_frauds` known frauds up (a handful of frauds gives an
AUC-PR that swings by tenths).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from core.settings import Settings

Role = Literal["served", "shadow"]


@dataclass(frozen=True)
class VersionPerformance:
    """One version's live figures over the matured rows it scored (served or in shadow)."""

    version: str
    role: Role
    rows: int
    frauds: int
    auc_pr: float | None  # None without both classes
    recall_at_1pct_fpr: float | None
    sufficient: bool  # frauds >= monitoring.min_labelled_frauds

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class LivePerformance:
    first: date  # event dates of the matured window
    last: date
    labels_as_of: date  # chargebacks reported before the end of this date count
    rows: int
    frauds: int
    versions: tuple[VersionPerformance, ...]

    def of(self, version: str | None, role: Role) -> VersionPerformance | None:
        return next((v for v in self.versions if v.version == version and v.role == role), None)

    def to_dict(self) -> dict:
        return {
            "first": self.first.isoformat(),
            "last": self.last.isoformat(),
            "labels_as_of": self.labels_as_of.isoformat(),
            "rows": self.rows,
            "frauds": self.frauds,
            "versions": [v.to_dict() for v in self.versions],
        }


def matured_window(settings: Settings, day: date) -> tuple[date, date]:
    """The event dates whose labels have matured by the end of `day`."""
    last = day - timedelta(days=settings.training.label_maturity_days)
    return last - timedelta(days=settings.monitoring.window_days - 1), last


def known_frauds(settings: Settings, transaction_ids: pa.Array, first: date, day: date) -> np.ndarray:
    """Per id, whether a chargeback for it was reported before the end of `day` (silver labels of the
    arrival dates first .. day: a chargeback is reported on or after its transaction's date)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from model_contract.inputs import cutoff, utc
    from pipelines.lake import Tables
    from training.dataset import read_partitions

    labels_root = Tables(settings.lake).silver_labels
    if not labels_root.is_dir():  # no chargeback ingested yet: nothing is known to be fraud
        return np.zeros(len(transaction_ids), dtype=bool)
    labels = utc(
        read_partitions(labels_root, first, day, ["transaction_id", "is_fraud", "label_timestamp"]),
        "label_timestamp",
    )
    known = pc.and_(
        pc.less(labels["label_timestamp"], pa.scalar(cutoff(day), pa.timestamp("us", tz="UTC"))),
        pc.cast(labels["is_fraud"], pa.bool_()),
    )
    fraud_ids = pc.unique(labels["transaction_id"].filter(known))
    return pc.is_in(transaction_ids, value_set=fraud_ids).to_numpy(zero_copy_only=False)


def version_performance(
    version: str, role: Role, labels: np.ndarray, scores: np.ndarray, min_frauds: int
) -> VersionPerformance:
    """The figures of one version's scores against the labels (pure)."""
    from training.metrics import average_precision, recall_at_fpr

    frauds = int(labels.sum())
    both = 0 < frauds < len(labels)
    return VersionPerformance(
        version=version,
        role=role,
        rows=len(labels),
        frauds=frauds,
        auc_pr=average_precision(labels, scores) if both else None,
        recall_at_1pct_fpr=recall_at_fpr(labels, scores, 0.01) if both else None,
        sufficient=both and frauds >= min_frauds,
    )


def performance_of_log(log: pd.DataFrame, labels: np.ndarray, min_frauds: int) -> list[VersionPerformance]:
    """Per served version and per shadow version of scoring-log rows `log` (model_version, score,
    shadow_version, shadow_score) with their labels (pure)."""
    found = []
    for version, rows in log.groupby("model_version", sort=True).indices.items():
        found.append(
            version_performance(
                str(version), "served", labels[rows], log["score"].to_numpy("float64")[rows], min_frauds
            )
        )
    shadow = log["shadow_version"].notna() & log["shadow_score"].notna()
    shadowed = log[shadow]
    for version, rows in shadowed.groupby("shadow_version", sort=True).indices.items():
        found.append(
            version_performance(
                str(version),
                "shadow",
                labels[shadow.to_numpy()][rows],
                shadowed["shadow_score"].to_numpy("float64")[rows],
                min_frauds,
            )
        )
    return found


def live_performance(settings: Settings, day: date) -> LivePerformance:
    """The live figures of the check of `day` (see the module docstring)."""
    from serving.scoring_log import read_scoring_log

    first, last = matured_window(settings, day)
    columns = ["transaction_id", "scored_at", "model_version", "score", "shadow_version", "shadow_score"]
    table = read_scoring_log(settings.scoring_log_dir, first, last, columns)
    # A transaction scored twice (a client's retry) counts once, as last scored.
    log = (
        table.to_pandas()
        .sort_values("scored_at", kind="stable")
        .drop_duplicates("transaction_id", keep="last")
        .reset_index(drop=True)
    )
    import pyarrow as pa

    labels = known_frauds(settings, pa.array(log["transaction_id"], pa.string()), first, day).astype(int)
    versions = performance_of_log(log, labels, settings.monitoring.min_labelled_frauds)
    return LivePerformance(first, last, day, len(log), int(labels.sum()), tuple(versions))
