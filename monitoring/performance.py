"""Live performance: how the served scores (and the shadow challenger's) ranked the transactions whose
labels have matured, counting only traffic the feed confirms.

**Which rows.** A check of day D looks at the event dates D - maturity - window_days + 1 .. D - maturity
(maturity: `training.label_maturity_days`, the same wait the training set applies) as the feed records
them: the silver transactions of those event dates that arrived by D. A scoring-log row counts only when
its transaction is one of them, for the same customer. A row whose id the feed never delivered (a caller's
test or a made-up transaction), or delivered for another customer, is counted as `unconfirmed` and left
out, and the caller's event time never places a row in the window: silver's does. A transaction scored more
than once counts once, as first scored (the decision that answered it).

**Declined transactions are excluded** (counted as `declined`). A declined fraud never becomes a
chargeback, so it would count as legitimate, and the better a model blocks fraud the worse it would score.
The figures are of the approved traffic: how well each version ranks what got through, the only part whose
labels can be observed. Correcting for the declined rows instead (reject inference) needs an assumption
about their fraud rate that nothing here measures. Every version is judged on the same approved rows.

**Labels** are as the training set reads them: fraud when a chargeback for the transaction was reported
before the end of D (silver labels by arrival date), legitimate otherwise. Per served version and per
shadow version: AUC-PR and recall at a 1% false-positive rate (training/metrics.py), with a verdict only
from `monitoring.min_labelled_frauds` known frauds up.

**Label completeness** comes before any verdict. Chargebacks arrive days to weeks after the transaction,
and a feed can come late or in part. The history says how many should be in by now: the transactions
that arrived in the `monitoring.label_history_days` before the window are all older than the window's, so
for each window transaction of age A (from its event to the end of D) the history's share of
transactions with a chargeback reported within A of their event is observed in full. The sum of those
shares over the window is the expected count; the reported count below `monitoring.min_label_ratio` of
it (or no history of frauds to compare with) gives no verdict, with both figures in the reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import date, timedelta
from typing import TYPE_CHECKING, Literal

import numpy as np

from model_contract.inputs import CATEGORICAL_FEATURES, NUMERIC_FEATURES

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
class LabelCompleteness:
    """The chargebacks reported for the window against what the history says should be by now."""

    complete: bool
    reason: str
    reported: int  # frauds reported so far among the window's feed transactions
    expected: float | None  # from the history at the same ages; None without a history of frauds
    history_rows: int
    history_frauds: int

    @property
    def ratio(self) -> float | None:
        return None if not self.expected else self.reported / self.expected

    def to_dict(self) -> dict:
        return {**asdict(self), "ratio": self.ratio}


@dataclass(frozen=True)
class LivePerformance:
    first: date  # event dates of the matured window (the feed's event time)
    last: date
    labels_as_of: date  # chargebacks reported before the end of this date count
    rows: int  # confirmed, approved rows the figures are of
    frauds: int
    versions: tuple[VersionPerformance, ...]
    unconfirmed: int = 0  # logged rows dated in the window that the feed does not confirm
    declined: int = 0  # confirmed rows the served model declined (excluded)
    completeness: LabelCompleteness | None = None
    # The rows the figures are of (inputs, versions, scores, `label`), for comparing versions on them.
    frame: pd.DataFrame | None = field(default=None, compare=False, repr=False)

    def of(self, version: str | None, role: Role) -> VersionPerformance | None:
        return next((v for v in self.versions if v.version == version and v.role == role), None)

    def to_dict(self) -> dict:
        return {
            "first": self.first.isoformat(),
            "last": self.last.isoformat(),
            "labels_as_of": self.labels_as_of.isoformat(),
            "rows": self.rows,
            "frauds": self.frauds,
            "unconfirmed": self.unconfirmed,
            "declined": self.declined,
            "completeness": None if self.completeness is None else self.completeness.to_dict(),
            "versions": [v.to_dict() for v in self.versions],
        }


def matured_window(settings: Settings, day: date) -> tuple[date, date]:
    """The event dates whose labels have matured by the end of `day`."""
    from training.label_maturity import label_maturity

    last = day - timedelta(days=label_maturity(settings, day).days)
    return last - timedelta(days=settings.monitoring.window_days - 1), last


def fraud_reports(settings: Settings, first: date, day: date) -> pa.Table:
    """transaction_id and label_timestamp of the fraud chargebacks reported before the end of `day`, from
    the silver label arrivals first .. day (a chargeback is reported on or after its transaction's date);
    the first report of a transaction where it was reported twice."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from model_contract.inputs import cutoff, utc
    from pipelines.lake import Tables
    from training.dataset import read_partitions

    stamp = pa.timestamp("us", tz="UTC")
    empty = pa.table({"transaction_id": pa.array([], pa.string()), "label_timestamp": pa.array([], stamp)})
    root = Tables(settings.lake).silver_labels
    if not any(root.glob("arrival_date=*/*.parquet")):  # no chargeback ingested yet
        return empty
    labels = utc(
        read_partitions(root, first, day, ["transaction_id", "is_fraud", "label_timestamp"]),
        "label_timestamp",
    )
    known = pc.and_(
        pc.less(labels["label_timestamp"], pa.scalar(cutoff(day), stamp)),
        pc.cast(labels["is_fraud"], pa.bool_()),
    )
    reports = labels.filter(known).select(["transaction_id", "label_timestamp"])
    if reports.num_rows == 0:
        return empty
    return (
        reports.group_by("transaction_id")
        .aggregate([("label_timestamp", "min")])
        .rename_columns(["transaction_id", "label_timestamp"])
    )


def _feed_window(settings: Settings, first: date, last: date, day: date) -> pd.DataFrame:
    """The silver transactions of event dates first .. last that arrived by `day`: transaction_id,
    customer_id and event_timestamp as the feed recorded them."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    from model_contract.inputs import cutoff, utc
    from pipelines.lake import Tables
    from training.dataset import read_partitions

    root = Tables(settings.lake).silver
    columns = ["transaction_id", "customer_id", "event_timestamp"]
    if not any(root.glob("arrival_date=*/*.parquet")):
        return pd.DataFrame({c: pd.Series(dtype="object") for c in columns})
    table = utc(read_partitions(root, first, day, columns), "event_timestamp")
    stamp = pa.timestamp("us", tz="UTC")
    start = cutoff(first - timedelta(days=1))
    inside = pc.and_(
        pc.greater_equal(table["event_timestamp"], pa.scalar(start, stamp)),
        pc.less(table["event_timestamp"], pa.scalar(cutoff(last), stamp)),
    )
    return table.filter(inside).to_pandas().drop_duplicates("transaction_id").reset_index(drop=True)


def label_completeness(
    settings: Settings, first: date, day: date, window_times: np.ndarray, reported: int, reports: pa.Table
) -> LabelCompleteness:
    """Whether the window's reported chargebacks (`reported` of the feed transactions with event times
    `window_times`, epoch microseconds) are as many as the history says should be in by the end of `day`
    (see the module docstring). `reports`: the fraud reports of arrivals first - label_history_days .. day."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from model_contract.inputs import cutoff, utc
    from pipelines.lake import Tables

    policy = settings.monitoring
    history_first = first - timedelta(days=policy.label_history_days)
    history_last = first - timedelta(days=1)
    span = f"transactions that arrived {history_first}..{history_last}"
    root = Tables(settings.lake).silver
    rows, frauds, lags = 0, 0, np.zeros(0, dtype="int64")
    if any(root.glob("arrival_date=*/*.parquet")):
        dataset = ds.dataset(root, format="parquet", partitioning="hive")
        arrival = ds.field("arrival_date").cast("string")
        arrived = (arrival >= history_first.isoformat()) & (arrival <= history_last.isoformat())
        rows = dataset.count_rows(filter=arrived)
        if rows and reports.num_rows:
            found = dataset.to_table(
                columns=["transaction_id", "event_timestamp"],
                filter=arrived & ds.field("transaction_id").isin(reports["transaction_id"]),
            )
            found = (
                utc(found, "event_timestamp")
                .group_by("transaction_id")
                .aggregate([("event_timestamp", "min")])
                .rename_columns(["transaction_id", "event_timestamp"])
            )
            joined = found.join(reports, "transaction_id")
            lag = pc.subtract(
                pc.cast(joined["label_timestamp"], pa.int64()), pc.cast(joined["event_timestamp"], pa.int64())
            )
            lags = np.sort(lag.to_numpy(zero_copy_only=False).astype("int64"))
            frauds = len(lags)
    if frauds < policy.min_labelled_frauds:
        return LabelCompleteness(
            False,
            f"no label history to check the chargebacks against: {frauds} reported frauds among {rows} "
            f"{span} (a verdict needs {policy.min_labelled_frauds}); no verdict until the feed has one",
            reported, None, rows, frauds,
        )  # fmt: skip
    end = int(cutoff(day).timestamp() * 1_000_000)
    ages = end - np.asarray(window_times, dtype="int64")
    expected = float(np.searchsorted(lags, ages, side="right").sum() / rows)
    ratio = reported / expected if expected > 0 else float("inf")
    figures = (
        f"{reported} chargebacks reported by {day} for the window's {len(ages)} transactions, "
        f"{expected:.1f} expected at the same ages from the {span} ({frauds} frauds in {rows})"
    )
    if ratio < policy.min_label_ratio:
        return LabelCompleteness(
            False,
            f"labels incomplete: {figures}, ratio {ratio:.2f} below {policy.min_label_ratio}: the chargeback "
            "feed is late or partial; no verdict until it catches up",
            reported, expected, rows, frauds,
        )  # fmt: skip
    return LabelCompleteness(
        True, f"labels complete: {figures}, ratio {ratio:.2f}", reported, expected, rows, frauds
    )


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


LOG_COLUMNS = [
    "transaction_id",
    "customer_id",
    "event_timestamp",
    "scored_at",
    "model_version",
    "score",
    "decision",
    "shadow_version",
    "shadow_score",
    *NUMERIC_FEATURES,
    *CATEGORICAL_FEATURES,
]


def live_performance(settings: Settings, day: date) -> LivePerformance:
    """The live figures of the check of `day` (see the module docstring)."""
    import pandas as pd

    from model_contract.inputs import cutoff
    from serving.scorer import DECLINE
    from serving.scoring_log import read_scoring_log

    policy = settings.monitoring
    first, last = matured_window(settings, day)
    feed = _feed_window(settings, first, last, day)
    logged = read_scoring_log(
        settings.scoring_log_dir, first, last, LOG_COLUMNS, by_event_time=False
    ).to_pandas()
    claimed = logged["event_timestamp"]
    dated_in_window = logged[
        (claimed >= pd.Timestamp(cutoff(first - timedelta(days=1)))) & (claimed < pd.Timestamp(cutoff(last)))
    ]
    matched = logged.merge(
        feed.rename(columns={"customer_id": "feed_customer_id", "event_timestamp": "feed_event_timestamp"}),
        on="transaction_id",
    )
    confirmed = (
        matched[matched["customer_id"] == matched["feed_customer_id"]]
        .sort_values("scored_at", kind="stable")
        .drop_duplicates("transaction_id", keep="first")
    )
    # A row dated in the window whose (transaction, customer) the feed does not have there; a retry of a
    # confirmed row is not one.
    feed_keys = pd.MultiIndex.from_frame(feed[["transaction_id", "customer_id"]])
    unconfirmed = int(
        (~pd.MultiIndex.from_frame(dated_in_window[["transaction_id", "customer_id"]]).isin(feed_keys)).sum()
    )
    approved = confirmed[confirmed["decision"] != DECLINE].reset_index(drop=True)
    declined = len(confirmed) - len(approved)
    reports = fraud_reports(settings, first - timedelta(days=policy.label_history_days), day)
    fraud_ids = set(reports["transaction_id"].to_pylist())
    window_times = feed["event_timestamp"].astype("datetime64[us, UTC]").astype("int64").to_numpy()
    completeness = label_completeness(
        settings, first, day, window_times, int(feed["transaction_id"].isin(fraud_ids).sum()), reports
    )
    labels = approved["transaction_id"].isin(fraud_ids).to_numpy().astype(int)
    approved["label"] = labels
    versions = performance_of_log(approved, labels, policy.min_labelled_frauds)
    return LivePerformance(
        first,
        last,
        day,
        rows=len(approved),
        frauds=int(labels.sum()),
        versions=tuple(versions),
        unconfirmed=unconfirmed,
        declined=declined,
        completeness=completeness,
        frame=approved,
    )
