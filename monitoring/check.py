"""One monitoring check of a date: drift of the model's inputs and score against the champion's training
reference, live performance on matured labels, the rollback rule; results to the results table and MLflow.

**Which traffic.** The inputs of day D's window (`monitoring.window_days` up to D) come from the scoring
log when it holds at least `monitoring.min_rows` rows: that is what the model actually received (the
online store's state at scoring time, the request's own values) and its scores are what it served. Without
scoring traffic (no scoring service in front of the feed, as in the demo) they are the window's arrived
transactions built as the training set builds them (silver, the transaction's own columns, the feature
service's point-in-time state from gold: training/dataset.py, features/offline.py) and scored offline by
the champion: drift of the feed is then still seen before a model serves it. The score's drift is the
champion's scores only (another version's scores are not comparable with its reference).

`is_weekend` is left out of the drift tests: a one-day window is all weekend or none by construction,
against a reference with two days in seven.

**Rollback.** When the champion's live AUC-PR (on matured traffic it served, with at least
`monitoring.min_labelled_frauds` frauds) is below the previous champion's by more than
`monitoring.max_live_auc_pr_drop`, the gate's rollback (training/registry.py) restores the previous
champion, with a reason naming both figures; the promotion history records it. The previous champion's
figure is, in order: its shadow scores on the same window, its own served traffic in the window, or the
latest check of earlier days that measured it while it served (the results table).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from model_contract.inputs import CATEGORICAL_FEATURES, NUMERIC_FEATURES
from monitoring.drift import DriftReport, InputDrift, compare_inputs, drift_report, numeric_drift
from monitoring.performance import LivePerformance, VersionPerformance, live_performance
from monitoring.reference import SCORE, categories_as_the_model_sees_them, model_matrix

if TYPE_CHECKING:
    import pandas as pd

    from core.settings import Settings
    from monitoring.reference import Reference, Scorer

log = logging.getLogger(__name__)

DRIFT_EXCLUDED = ("is_weekend",)  # see the module docstring
DRIFT_NUMERIC: tuple[str, ...] = tuple(n for n in NUMERIC_FEATURES if n not in DRIFT_EXCLUDED)


@dataclass(frozen=True)
class CurrentInputs:
    """The window's traffic: DRIFT_NUMERIC and CATEGORICAL_FEATURES per row, and the champion's scores."""

    frame: pd.DataFrame
    scores: np.ndarray | None  # None: no champion, or the rows it served are fewer than min_rows
    source: str  # scoring_log | lake
    first: date
    last: date


@dataclass(frozen=True)
class RollbackOutcome:
    """The rollback rule's decision; `rolled_back` when the champion was moved back."""

    rolled_back: bool
    reason: str
    champion_before: str | None = None
    champion_after: str | None = None
    history_id: int | None = None


@dataclass(frozen=True)
class CheckResult:
    check_id: str
    day: date
    model_name: str
    champion_version: str | None
    feature_source: str
    drift: DriftReport
    performance: LivePerformance
    rollback: RollbackOutcome
    notes: tuple[str, ...] = ()
    dag_id: str = ""
    dag_run_id: str = ""
    mlflow_run_id: str | None = field(default=None, compare=False)

    @property
    def drifted(self) -> bool:
        return self.drift.verdict == "drift"

    def summary(self) -> str:
        """`drift: log_amount_usd PSI 0.43 KS 0.31; channel PSI 0.52 (2026-01-10, ...)`, or the verdict."""
        if not self.drifted:
            return f"{self.drift.verdict} on {self.day}: {self.drift.reason}"
        listed = "; ".join(i.describe() for i in sorted(self.drift.drifted, key=lambda i: -i.psi))
        return (
            f"drift: {listed} (check of {self.day}, champion v{self.champion_version}, "
            f"{self.drift.rows} rows from the {self.feature_source})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "check_id": self.check_id,
            "day": self.day.isoformat(),
            "model_name": self.model_name,
            "champion_version": self.champion_version,
            "feature_source": self.feature_source,
            "verdict": self.drift.verdict,
            "summary": self.summary(),
            "drift": self.drift.to_dict(),
            "performance": self.performance.to_dict(),
            "rollback": asdict(self.rollback),
            "notes": list(self.notes),
            "mlflow_run_id": self.mlflow_run_id,
        }


# --- the window's traffic --------------------------------------------------------------------------------


def drift_window(settings: Settings, day: date) -> tuple[date, date]:
    return day - timedelta(days=settings.monitoring.window_days - 1), day


def scoring_log_inputs(settings: Settings, day: date, champion: str | None) -> CurrentInputs:
    """The window's scored transactions as the scoring log holds them (a retried transaction once)."""
    from serving.scoring_log import read_scoring_log

    first, last = drift_window(settings, day)
    columns = [
        "transaction_id",
        "scored_at",
        *NUMERIC_FEATURES,
        *CATEGORICAL_FEATURES,
        "model_version",
        "score",
    ]
    rows = (
        read_scoring_log(settings.scoring_log_dir, first, last, columns)
        .to_pandas()
        .sort_values("scored_at", kind="stable")
        .drop_duplicates("transaction_id", keep="last")
        .reset_index(drop=True)
    )
    frame = rows[list(DRIFT_NUMERIC)].astype("float64").join(categories_as_the_model_sees_them(rows))
    served = rows["model_version"] == champion
    scores = rows.loc[served, "score"].to_numpy("float64") if champion is not None else None
    if scores is not None and len(scores) < settings.monitoring.min_rows:
        scores = None
    return CurrentInputs(frame, scores, "scoring_log", first, last)


def lake_inputs(settings: Settings, day: date, scorer: Scorer | None) -> CurrentInputs:
    """The window's arrived transactions with the model inputs the training set gives them, scored by the
    champion offline. Raises NothingToTrainError when none arrived."""
    from features import offline
    from model_contract.inputs import FEATURE_LAG, SERVICE_FEATURES
    from training.dataset import labeled_transactions, transaction_columns

    first, last = drift_window(settings, day)
    transactions = labeled_transactions(settings, day, settings.monitoring.window_days)
    entities = transactions[["customer_id", "merchant_id"]].copy()
    entities["event_timestamp"] = transactions["event_timestamp"] - FEATURE_LAG
    state = offline.historical_features(settings, entities)[list(SERVICE_FEATURES)].astype("float64")
    inputs = transaction_columns(transactions).reset_index(drop=True).join(state)
    frame = inputs[list(DRIFT_NUMERIC)].join(
        categories_as_the_model_sees_them(transactions).reset_index(drop=True)
    )
    scores = scorer.score(model_matrix(inputs)).astype("float64") if scorer is not None else None
    return CurrentInputs(frame, scores, "lake", first, last)


def current_inputs(settings: Settings, day: date, champion: str | None) -> CurrentInputs:
    """The scoring log's window when it has min_rows rows, else the lake's (see the module docstring)."""
    from monitoring.reference import version_scorer
    from training.dataset import NothingToTrainError

    logged = scoring_log_inputs(settings, day, champion)
    if len(logged.frame) >= settings.monitoring.min_rows:
        return logged
    try:
        return lake_inputs(settings, day, version_scorer(settings, champion) if champion else None)
    except NothingToTrainError as exc:  # nothing arrived either: the (short) log is all there is
        log.info(
            "no arrived transactions for %s either (%s); using the scoring log's %d rows",
            day,
            exc,
            len(logged.frame),
        )
        return logged


# --- drift ------------------------------------------------------------------------------------------------


def compare_with_reference(
    settings: Settings, reference: Reference | None, current: CurrentInputs
) -> DriftReport:
    """The drift report of the window's inputs (and the champion's scores) against the reference."""
    policy = settings.monitoring
    if reference is None:
        return drift_report([], len(current.frame), 0, policy)
    inputs: list[InputDrift] = compare_inputs(
        reference.frame, current.frame, policy, DRIFT_NUMERIC, CATEGORICAL_FEATURES
    )
    if current.scores is not None:
        inputs.append(
            numeric_drift(SCORE, reference.frame[SCORE].to_numpy("float64"), current.scores, policy, "score")
        )
    return drift_report(inputs, len(current.frame), reference.rows, policy)


# --- rollback ---------------------------------------------------------------------------------------------


def rollback_decision(
    champion: str | None,
    champion_live: VersionPerformance | None,
    previous: str | None,
    previous_auc_pr: tuple[float, str] | None,
    max_drop: float,
    min_frauds: int,
) -> tuple[bool, str]:
    """Whether to roll the champion back, and why (pure; the reason names both figures)."""
    if champion is None or previous is None:
        return False, "no previous champion to compare the champion with"
    if champion_live is None or not champion_live.sufficient or champion_live.auc_pr is None:
        frauds = 0 if champion_live is None else champion_live.frauds
        return False, (
            f"champion v{champion}: {frauds} labelled frauds in the matured traffic it served; a live "
            f"verdict needs {min_frauds}"
        )
    if previous_auc_pr is None:
        return False, f"no live AUC-PR of the previous champion v{previous} with {min_frauds} frauds yet"
    before, measured = previous_auc_pr
    now = champion_live.auc_pr
    drop = before - now
    figures = (
        f"live AUC-PR of champion v{champion} {now:.4f} ({champion_live.rows} matured transactions, "
        f"{champion_live.frauds} frauds) vs previous champion v{previous}'s {before:.4f} ({measured})"
    )
    if drop > max_drop:
        return True, f"{figures}: down {drop:.4f}, more than {max_drop}"
    return False, f"{figures}: down {drop:.4f}, within {max_drop}"


def previous_live_auc_pr(
    settings: Settings, previous: str | None, performance: LivePerformance, day: date
) -> tuple[float, str] | None:
    """The previous champion's live AUC-PR and where it was measured (see the module docstring)."""
    from monitoring.store import served_live_auc_pr

    if previous is None:
        return None
    window = f"{performance.first}..{performance.last}"
    shadow = performance.of(previous, "shadow")
    if shadow is not None and shadow.sufficient and shadow.auc_pr is not None:
        return shadow.auc_pr, f"scored in shadow on the same traffic, {window}"
    served = performance.of(previous, "served")
    if served is not None and served.sufficient and served.auc_pr is not None:
        return served.auc_pr, f"traffic it served, {window}"
    found = served_live_auc_pr(settings, previous, before=day)
    return None if found is None else (found[0], f"traffic it served, check of {found[1]}")


def champion_history(settings: Settings) -> list[str]:
    """The champions as the promotion history replays them (last: the champion)."""
    from training import steps
    from training.ledger import Decision, champion_stack

    return champion_stack([Decision(**row) for row in steps.history(settings)["history"]])


def apply_rollback_rule(
    settings: Settings,
    day: date,
    champion: str | None,
    performance: LivePerformance,
    dag_id: str,
    dag_run_id: str,
) -> RollbackOutcome:
    """Decide, and roll back through the gate when the rule says so."""
    from training import steps

    stack = champion_history(settings)
    previous = stack[-2] if len(stack) >= 2 and stack[-1] == champion else None
    policy = settings.monitoring
    roll, reason = rollback_decision(
        champion,
        performance.of(champion, "served"),
        previous,
        previous_live_auc_pr(settings, previous, performance, day),
        policy.max_live_auc_pr_drop,
        policy.min_labelled_frauds,
    )
    if not roll:
        return RollbackOutcome(False, reason)
    by = f" [monitoring check of {day}" + (f", {dag_id} run {dag_run_id}]" if dag_id else "]")
    log.warning("rolling back: %s", reason)
    decision = steps.rollback(settings, f"live performance: {reason}{by}")
    return RollbackOutcome(
        True, decision["reason"], champion, decision["champion_version"], decision["history_id"]
    )


# --- the check --------------------------------------------------------------------------------------------


def run_check(settings: Settings, day: date, dag_id: str = "", dag_run_id: str = "") -> CheckResult:
    """Check `day`: drift, live performance, the rollback rule; record the result in the results table and
    MLflow, and return it. A rollback refused by the gate (the alias was moved outside `mlops`) is recorded
    first, then raised."""
    from monitoring.reference import load_reference
    from training.registry import ModelRegistry, PromotionError

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    champion = registry.champion()
    notes: list[str] = []
    reference = None
    if champion is None:
        notes.append("no champion yet: no reference to compare traffic with")
    else:
        reference = load_reference(settings, champion)
    current = current_inputs(settings, day, champion)
    if champion is not None and current.scores is None:
        notes.append(
            f"the score was not compared: fewer than {settings.monitoring.min_rows} rows scored by "
            f"champion v{champion} in {current.first}..{current.last}"
        )
    drift = compare_with_reference(settings, reference, current)
    performance = live_performance(settings, day)
    failure: PromotionError | None = None
    try:
        rollback = apply_rollback_rule(settings, day, champion, performance, dag_id, dag_run_id)
    except PromotionError as exc:
        failure = exc
        rollback = RollbackOutcome(False, f"the rollback the rule asked for failed: {exc}")
    result = CheckResult(
        check_id=uuid.uuid4().hex[:16],
        day=day,
        model_name=registry.name,
        champion_version=champion,
        feature_source=current.source,
        drift=drift,
        performance=performance,
        rollback=rollback,
        notes=tuple(notes),
        dag_id=dag_id,
        dag_run_id=dag_run_id,
    )
    result = record(settings, result)
    log.info("monitoring check of %s: %s; rollback: %s", day, result.summary(), rollback.reason)
    if failure is not None:
        raise failure
    return result


def record(settings: Settings, result: CheckResult) -> CheckResult:
    """Log the check to MLflow and append its rows to the results table; the result with its run id."""
    from dataclasses import replace

    from monitoring.report import log_check
    from monitoring.store import append_results

    run_id = log_check(settings, result, settings.monitoring.psi_threshold)
    result = replace(result, mlflow_run_id=run_id)
    append_results(settings, result_rows(result))
    return result


def result_rows(result: CheckResult) -> list[dict[str, Any]]:
    """The results table's rows of one check (monitoring/store.py): inputs, versions, the verdict."""
    common = {
        "check_id": result.check_id,
        "recorded_at": datetime.now(UTC).isoformat(timespec="milliseconds"),
        "day": result.day.isoformat(),
        "model_name": result.model_name,
        "champion_version": result.champion_version,
        "feature_source": result.feature_source,
        "dag_id": result.dag_id or None,
        "dag_run_id": result.dag_run_id or None,
        "mlflow_run_id": result.mlflow_run_id,
    }
    rows = [
        {
            **common,
            "kind": i.kind,
            "name": i.name,
            "model_version": result.champion_version if i.kind == "score" else None,
            "psi": i.psi,
            "ks": i.ks,
            "drifted": i.drifted,
            "rows": i.rows,
            "reference_rows": i.reference_rows,
            "null_share": i.null_share,
            "reference_null_share": i.reference_null_share,
        }
        for i in result.drift.inputs
    ]
    rows += [
        {
            **common,
            "kind": "performance",
            "name": v.role,
            "model_version": v.version,
            "role": v.role,
            "rows": v.rows,
            "labelled_frauds": v.frauds,
            "auc_pr": v.auc_pr,
            "recall_at_1pct_fpr": v.recall_at_1pct_fpr,
            "sufficient": v.sufficient,
        }
        for v in result.performance.versions
    ]
    note = " | ".join([result.drift.reason, *result.notes, f"rollback: {result.rollback.reason}"])
    rows.append(
        {
            **common,
            "kind": "check",
            "name": "verdict",
            "rows": result.drift.rows,
            "reference_rows": result.drift.reference_rows,
            "verdict": result.drift.verdict,
            "drifted": result.drifted,
            "note": note,
        }
    )
    return rows


def run_checks(settings: Settings, days: Sequence[date], dag_id: str = "", dag_run_id: str = "") -> dict:
    """Check each day in turn; the JSON result a task or the CLI hands on: every check, whether any
    drifted, and the FRAUD_DRIFT asset event's `extra` (None without drift)."""
    results = [run_check(settings, day, dag_id, dag_run_id) for day in sorted(set(days))]
    return {
        "checks": [r.to_dict() for r in results],
        "drift": any(r.drifted for r in results),
        "rolled_back": any(r.rollback.rolled_back for r in results),
        "drift_event": drift_event(results),
    }


def drift_event(results: Sequence[CheckResult]) -> dict[str, Any] | None:
    """What the FRAUD_DRIFT asset event carries: the drifted days and inputs with their figures, a one-line
    summary (what the retrain run records as its reason), the checks' ids and MLflow runs."""
    drifted = [r for r in results if r.drifted]
    if not drifted:
        return None
    return {
        "summary": " | ".join(r.summary() for r in drifted),
        "days": [r.day.isoformat() for r in drifted],
        "champion_version": drifted[-1].champion_version,
        "drifted": [
            {
                "day": r.day.isoformat(),
                "input": i.name,
                "kind": i.kind,
                "psi": round(i.psi, 4),
                "ks": None if i.ks is None else round(i.ks, 4),
            }
            for r in drifted
            for i in r.drift.drifted
        ],
        "check_ids": [r.check_id for r in drifted],
        "mlflow_run_ids": [r.mlflow_run_id for r in drifted],
    }
