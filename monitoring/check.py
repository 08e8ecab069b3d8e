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

**Rollback** (`apply_rollback_rule`), in this order:
- label completeness (monitoring/performance.py): a late or partial chargeback feed gives no verdict;
- at most one rollback per run (a catch-up over several dates), and none within
  `monitoring.rollback_cooldown_hours` of any alias move (the promotion history's time);
- the champion and the previous champion on the same rows: the confirmed, approved, matured traffic the
  champion served, the previous champion's scores being its shadow scores where it shadowed all of those
  rows, else its scores of the inputs the service logged, computed now. Figures of other windows are never
  compared (a window's labels and mix differ);
- a rollback needs the drop in AUC-PR above `monitoring.max_live_auc_pr_drop` and its paired bootstrap
  interval (`monitoring.rollback_confidence`) above zero, with `monitoring.min_labelled_frauds` frauds;
- the rollback is a compare-and-swap on the champion the check judged (training/registry.py): when a
  promotion landed meanwhile, nothing moves, the refusal is in the promotion history and the outcome says
  so. The promotion history records a rollback with both figures and the interval.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from core.alerts import Alert, send
from model_contract.inputs import CATEGORICAL_FEATURES, NUMERIC_FEATURES
from monitoring.drift import DriftReport, InputDrift, compare_inputs, drift_report, numeric_drift
from monitoring.performance import LivePerformance, live_performance
from monitoring.reference import SCORE, categories_as_the_model_sees_them, model_matrix

if TYPE_CHECKING:
    import pandas as pd

    from core.settings import Settings
    from monitoring.reference import Reference, Scorer
    from monitoring.service import ServiceDay
    from training.ledger import Decision

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
    score_ids: np.ndarray | None = None  # the transaction ids of `scores`, in their order


@dataclass(frozen=True)
class RollbackOutcome:
    """The rollback rule's decision; `rolled_back` when the champion was moved back."""

    rolled_back: bool
    reason: str
    champion_before: str | None = None
    champion_after: str | None = None
    history_id: int | None = None
    refused: bool = False  # the rule asked for a rollback, and the compare-and-swap found another champion


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
    service: ServiceDay | None = None  # the scoring service's objectives of the day
    estimate: dict[str, Any] | None = None  # performance_estimate's
    # where MLflow's champion alias points against the promotion history (training/registry.py alias_state)
    alias: dict[str, Any] | None = None
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
            "service": None if self.service is None else self.service.to_dict(),
            "estimate": self.estimate,
            "alias": self.alias,
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
    ids = None if scores is None else rows.loc[served, "transaction_id"].to_numpy()
    return CurrentInputs(frame, scores, "scoring_log", first, last, ids)


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
    scores = (
        scorer.score(model_matrix(inputs, scorer.inputs)).astype("float64") if scorer is not None else None
    )
    ids = None if scores is None else transactions["transaction_id"].to_numpy()
    return CurrentInputs(frame, scores, "lake", first, last, ids)


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
    # The champion's own inputs: one trained before a feature was declared has no reference of it.
    numeric = [name for name in DRIFT_NUMERIC if name in reference.frame]
    inputs: list[InputDrift] = compare_inputs(
        reference.frame, current.frame, policy, numeric, CATEGORICAL_FEATURES
    )
    if current.scores is not None:
        inputs.append(
            numeric_drift(SCORE, reference.frame[SCORE].to_numpy("float64"), current.scores, policy, "score")
        )
    return drift_report(inputs, len(current.frame), reference.rows, policy)


# --- rollback ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """The champion and the previous champion on the same rows: the confirmed, approved, matured traffic
    the champion served (monitoring/performance.py), with a paired bootstrap interval of the drop."""

    champion: str
    previous: str
    source: str  # where the previous champion's scores came from
    rows: int
    frauds: int
    champion_auc_pr: float
    previous_auc_pr: float
    low: float  # the interval of the drop (previous - champion) at monitoring.rollback_confidence
    high: float

    @property
    def drop(self) -> float:
        return self.previous_auc_pr - self.champion_auc_pr


def paired_bootstrap(
    labels: np.ndarray,
    champion: np.ndarray,
    previous: np.ndarray,
    resamples: int,
    confidence: float,
    seed: int,
) -> tuple[float, float]:
    """The two-sided `confidence` interval of AP(previous) - AP(champion) over resamples of the same rows
    (each resample scores both versions on the same draw; draws without both classes are skipped)."""
    from training.metrics import average_precision

    rng = np.random.default_rng(seed)
    n = len(labels)
    drops = []
    for _ in range(resamples):
        pick = rng.integers(0, n, n)
        drawn = labels[pick]
        if 0 < drawn.sum() < n:
            drops.append(average_precision(drawn, previous[pick]) - average_precision(drawn, champion[pick]))
    if not drops:
        return float("nan"), float("nan")
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.asarray(drops), [tail, 1.0 - tail])
    return float(low), float(high)


def previous_scores(settings: Settings, rows: pd.DataFrame, previous: str) -> tuple[np.ndarray, str]:
    """The previous champion's scores of `rows`: its shadow scores where it scored all of them in shadow,
    else scored offline from the inputs the service logged (the same inputs the champion was given)."""
    from model_contract.inputs import categorical_codes
    from monitoring.reference import version_scorer

    shadow = rows["shadow_version"] == previous
    if len(rows) and bool(shadow.all()) and bool(rows["shadow_score"].notna().all()):
        return rows["shadow_score"].to_numpy("float64"), "its shadow scores"
    inputs = rows[list(NUMERIC_FEATURES)].astype("float64").reset_index(drop=True)
    codes = categorical_codes({c: rows[c].tolist() for c in CATEGORICAL_FEATURES})
    for name, values in codes.items():
        inputs[name] = values
    scorer = version_scorer(settings, previous)
    return scorer.score(model_matrix(inputs, scorer.inputs)).astype(
        "float64"
    ), f"scored offline ({scorer.kind})"


def compare_versions(
    settings: Settings, performance: LivePerformance, champion: str, previous: str, day: date
) -> tuple[Comparison | None, str]:
    """The champion against the previous champion on the rows the champion served, or None and why not."""
    from training.metrics import average_precision

    policy = settings.monitoring
    frame = performance.frame
    rows = frame[frame["model_version"] == champion] if frame is not None else None
    labels = np.zeros(0, dtype=int) if rows is None else rows["label"].to_numpy().astype(int)
    frauds = int(labels.sum())
    if rows is None or frauds < policy.min_labelled_frauds or frauds == len(labels):
        return None, (
            f"champion v{champion}: {frauds} labelled frauds in the confirmed, approved matured traffic it "
            f"served ({len(labels)} transactions); a live verdict needs {policy.min_labelled_frauds}"
        )
    champion_scores = rows["score"].to_numpy("float64")
    before, source = previous_scores(settings, rows, previous)
    low, high = paired_bootstrap(
        labels,
        champion_scores,
        before,
        policy.bootstrap_resamples,
        policy.rollback_confidence,
        day.toordinal(),
    )
    return Comparison(
        champion,
        previous,
        source,
        len(labels),
        frauds,
        average_precision(labels, champion_scores),
        average_precision(labels, before),
        low,
        high,
    ), ""


def rollback_decision(comparison: Comparison, max_drop: float, confidence: float) -> tuple[bool, str]:
    """Whether to roll the champion back, and why (pure; the reason names both figures and the interval):
    the drop is above `max_drop` and its interval lies above zero."""
    c = comparison
    figures = (
        f"live AUC-PR of champion v{c.champion} {c.champion_auc_pr:.4f} vs previous champion v{c.previous}'s "
        f"{c.previous_auc_pr:.4f} on the same {c.rows} confirmed, approved matured transactions "
        f"({c.frauds} frauds; v{c.previous} {c.source}): down {c.drop:.4f}, "
        f"{confidence:.0%} interval [{c.low:.4f}, {c.high:.4f}]"
    )
    if not c.drop > max_drop:
        return False, f"{figures}: within {max_drop}"
    if not c.low > 0:
        return False, f"{figures}: more than {max_drop}, but not significant (the interval reaches zero)"
    return True, f"{figures}: more than {max_drop} and significant"


def champion_history(settings: Settings) -> list[Decision]:
    """The promotion history, oldest first."""
    from training import steps
    from training.ledger import Decision

    return [Decision(**row) for row in steps.history(settings)["history"]]


def cooling_down(settings: Settings, history: Sequence[Decision]) -> str | None:
    """Why no rollback may happen now, when the last alias move is younger than the cool-down."""
    hours = settings.monitoring.rollback_cooldown_hours
    moves = [row for row in history if row.decision in ("promoted", "rolled_back")]
    if not moves or hours <= 0:
        return None
    last = moves[-1]
    at = datetime.fromisoformat(last.recorded_at)
    age = (datetime.now(UTC) - at).total_seconds() / 3600
    if age >= hours:
        return None
    return (
        f"cool-down: the alias moved {age:.1f} h ago ({last.action} to v{last.champion_after}, history row "
        f"{last.id}); no rollback within {hours} h of a move (monitoring.rollback_cooldown_hours)"
    )


def apply_rollback_rule(
    settings: Settings,
    day: date,
    champion: str | None,
    performance: LivePerformance,
    dag_id: str,
    dag_run_id: str,
    rolled_back_in_run: str | None = None,
) -> RollbackOutcome:
    """Decide, and roll back through the gate when the rule says so: label completeness first, then one
    rollback per run and the cool-down, then the two versions on the same rows with the significance test.
    The rollback is a compare-and-swap on the champion this check judged: a promotion that lands meanwhile
    stays, and the outcome says so."""
    from training import steps
    from training.ledger import champion_stack
    from training.registry import ChampionMovedError

    history = champion_history(settings)
    stack = champion_stack(history)
    if champion is None or len(stack) < 2:
        return RollbackOutcome(False, "no previous champion to compare the champion with")
    if stack[-1] != champion:
        return RollbackOutcome(
            False, f"the champion moved from v{champion} to v{stack[-1]} during the check: no verdict on it"
        )
    previous = stack[-2]
    completeness = performance.completeness
    if completeness is None or not completeness.complete:
        return RollbackOutcome(False, completeness.reason if completeness else "no label completeness check")
    if rolled_back_in_run is not None:
        return RollbackOutcome(
            False, f"this run already rolled back ({rolled_back_in_run}): one rollback a run"
        )
    waiting = cooling_down(settings, history)
    if waiting is not None:
        return RollbackOutcome(False, waiting)
    comparison, why_not = compare_versions(settings, performance, champion, previous, day)
    if comparison is None:
        return RollbackOutcome(False, why_not)
    policy = settings.monitoring
    roll, reason = rollback_decision(comparison, policy.max_live_auc_pr_drop, policy.rollback_confidence)
    if not roll:
        return RollbackOutcome(False, reason)
    by = f" [monitoring check of {day}" + (f", {dag_id} run {dag_run_id}]" if dag_id else "]")
    log.warning("rolling back: %s", reason)
    try:
        decision = steps.rollback(settings, f"live performance: {reason}{by}", champion, dag_id, dag_run_id)
    except ChampionMovedError as moved:
        log.warning("rollback not done: %s", moved)
        return RollbackOutcome(False, f"the rule asked for a rollback ({reason}), but {moved}", refused=True)
    return RollbackOutcome(
        True, decision["reason"], champion, decision["champion_version"], decision["history_id"]
    )


# --- the label-free estimate -----------------------------------------------------------------------------


def performance_estimate(
    settings: Settings, day: date, champion: str, current: CurrentInputs, matured: tuple[date, date]
) -> dict[str, Any] | None:
    """The champion's estimated AUC-PR and recall at the threshold on the day's traffic (monitoring/
    estimate.py; None without its scores of the day), and for the matured window's traffic (a one-day
    window) the same estimate beside the realised figure (labels as reported by the end of `day`) and its
    error."""
    from monitoring.estimate import calibration, estimate, reliability
    from monitoring.performance import fraud_reports
    from training.dataset import NothingToTrainError
    from training.metrics import average_precision
    from training.registry import ModelRegistry

    policy = settings.monitoring
    fitted = calibration(settings, champion)
    # where the service declines for the champion (its operating point, else serving.threshold)
    threshold = ModelRegistry(settings.mlflow_tracking_uri).decision_threshold(
        champion, settings.serving.threshold
    )

    def of(scores: np.ndarray, seed: int):
        probabilities = fitted.apply(scores)
        return estimate(probabilities, scores, threshold, policy.estimate_samples, seed)

    found: dict[str, Any] = {
        "day": day.isoformat(),
        "version": champion,
        "calibration": {k: v for k, v in asdict(fitted).items() if k not in ("x", "y")},
        "estimate": None,
        "reliable": None,
        "reliability": None,
        "matured": None,
    }
    if current.scores is not None:
        today = of(current.scores, day.toordinal())
        found["estimate"] = today.to_dict()
        found["reliable"], found["reliability"] = reliability(
            today, fitted, policy.max_implied_fraud_rate_ratio
        )
    first, last = matured
    try:
        earlier = current_inputs(settings, last, champion) if first == last else None
    except NothingToTrainError:
        earlier = None
    if earlier is not None and earlier.scores is not None and earlier.score_ids is not None:
        reported = set(fraud_reports(settings, first - timedelta(days=1), day)["transaction_id"].to_pylist())
        labels = np.fromiter(
            (i in reported for i in earlier.score_ids), dtype=bool, count=len(earlier.score_ids)
        )
        then = of(earlier.scores, last.toordinal())  # what the check of `last` estimated
        realised = (
            average_precision(labels.astype(int), earlier.scores) if 0 < labels.sum() < len(labels) else None
        )
        found["matured"] = {
            "day": last.isoformat(),
            "rows": len(labels),
            "frauds": int(labels.sum()),
            "estimate": then.to_dict(),
            "realised_auc_pr": realised,
            "error": None if realised is None or then.auc_pr is None else then.auc_pr - realised,
        }
    return found


# --- the check --------------------------------------------------------------------------------------------


def run_check(
    settings: Settings,
    day: date,
    dag_id: str = "",
    dag_run_id: str = "",
    rolled_back_in_run: str | None = None,
) -> CheckResult:
    """Check `day`: drift, live performance, the rollback rule; record the result in the results table and
    MLflow, and return it. A rollback refused by the gate (the alias was moved outside `mlops`) is recorded
    first, then raised."""
    from monitoring.reference import load_reference
    from training.registry import ModelRegistry, PromotionError, alias_mismatch, alias_state

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    alias = alias_state(registry, champion_history(settings))
    champion = alias["alias"]  # the version the alias names: what the service scores with
    notes: list[str] = []
    if alias["out_of_band"]:  # alerted (alerts_of); the rollback rule gives no verdict on such a champion
        notes.append(alias_mismatch(alias))
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
    estimated = None
    if champion is not None:
        try:
            estimated = performance_estimate(
                settings, day, champion, current, (performance.first, performance.last)
            )
        except Exception as exc:  # the estimate is one part of the check: its failure fails only itself
            log.exception("no label-free estimate for the check of %s", day)
            notes.append(f"no label-free estimate: {type(exc).__name__}: {exc}")
    failure: PromotionError | None = None
    try:
        rollback = apply_rollback_rule(
            settings, day, champion, performance, dag_id, dag_run_id, rolled_back_in_run
        )
    except PromotionError as exc:
        failure = exc
        rollback = RollbackOutcome(False, f"the rollback the rule asked for failed: {exc}")
    from monitoring.service import service_day

    result = CheckResult(
        service=service_day(settings, day),
        estimate=estimated,
        alias=alias,
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
    for alert in alerts_of(result, settings.monitoring.max_estimated_auc_pr_drop):
        send(settings, alert)
    if failure is not None:
        raise failure
    return result


def alerts_of(result: CheckResult, max_estimate_drop: float = 0.1) -> list[Alert]:
    """What a person must hear of a check: drift, a rollback done or refused, and labels that are late or
    partial against their history (a withheld verdict; not a feed's first weeks, which have no history)."""
    where = {
        "day": result.day.isoformat(),
        "check_id": result.check_id,
        "mlflow_run_id": result.mlflow_run_id,
    }
    found = []
    if result.drifted:
        found.append(Alert("drift", f"drift in the check of {result.day}", result.summary(), where))
    rollback = result.rollback
    if rollback.rolled_back:
        found.append(
            Alert(
                "rollback",
                f"champion rolled back v{rollback.champion_before} -> v{rollback.champion_after}",
                rollback.reason,
                {**where, "history_id": rollback.history_id},
            )
        )
    elif rollback.refused:
        found.append(
            Alert(
                "rollback_refused", f"rollback refused in the check of {result.day}", rollback.reason, where
            )
        )
    alias = result.alias
    if alias is not None and alias["out_of_band"]:
        from training.registry import alias_mismatch, version_label

        found.append(
            Alert(
                "alias_out_of_band",
                f"champion alias moved outside the promotion history: {version_label(alias['alias'])} "
                f"(history: {version_label(alias['recorded'])})",
                f"{result.model_name}: {alias_mismatch(alias)}. No gate, approval or ledger row stands "
                "behind it. Move it back, or record the decision with `mlops promote --version N --reason "
                "... --actor ...`.",
                {**where, **alias},
            )
        )
    estimated = result.estimate
    if estimated is not None and (estimated["estimate"] or {}).get("auc_pr") is not None:
        now, holdout = estimated["estimate"]["auc_pr"], estimated["calibration"]["holdout_auc_pr"]
        if now < holdout - max_estimate_drop:
            found.append(
                Alert(
                    "estimate_drop",
                    f"estimated AUC-PR of v{estimated['version']} fell to {now:.4f} on {result.day}",
                    f"the label-free estimate of champion v{estimated['version']}'s AUC-PR on the traffic "
                    f"of {result.day} is {now:.4f}, {holdout - now:.4f} below its holdout's {holdout:.4f} "
                    f"(alert beyond {max_estimate_drop}); labels will confirm it in the days to come",
                    {**where, **estimated},
                )
            )
    if estimated is not None and estimated["reliable"] is False:
        found.append(
            Alert(
                "estimate_unreliable",
                f"v{estimated['version']}'s scores imply another fraud rate on {result.day}",
                estimated["reliability"],
                {**where, **estimated},
            )
        )
    if result.service is not None and result.service.verdict == "missed":
        found.append(
            Alert(
                "service",
                f"scoring service missed its objectives on {result.day}",
                result.service.reason,
                {**where, **result.service.to_dict()},
            )
        )
    completeness = result.performance.completeness
    if completeness is not None and not completeness.complete and completeness.expected is not None:
        found.append(
            Alert(
                "label_lag",
                f"chargebacks late or partial for {result.performance.first}..{result.performance.last}",
                completeness.reason,
                {**where, **completeness.to_dict()},
            )
        )
    return found


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
    if result.estimate is not None and result.estimate["estimate"] is not None:
        import json

        estimated = result.estimate["estimate"]
        rows.append(
            {
                **common,
                "kind": "estimate",
                "name": "auc_pr",
                "model_version": result.estimate["version"],
                "rows": estimated["rows"],
                "auc_pr": estimated["auc_pr"],
                "note": json.dumps(result.estimate, default=str, sort_keys=True),
            }
        )
    matured = (result.estimate or {}).get("matured")
    if matured is not None:
        import json

        rows.append(
            {
                **common,
                "kind": "estimate",
                "name": "matured_auc_pr",  # auc_pr: the realised figure; the estimate and error in the note
                "model_version": result.estimate["version"] if result.estimate else None,
                "rows": matured["rows"],
                "labelled_frauds": matured["frauds"],
                "auc_pr": matured["realised_auc_pr"],
                "note": json.dumps(matured, default=str, sort_keys=True),
            }
        )
    if result.service is not None:
        rows.append(
            {
                **common,
                "kind": "service",
                "name": "objectives",
                "rows": result.service.requests,
                "verdict": result.service.verdict,
                "note": result.service.reason,
            }
        )
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
    results: list[CheckResult] = []
    rolled_back: str | None = None  # at most one rollback a run: the first one's check
    for day in sorted(set(days)):
        result = run_check(settings, day, dag_id, dag_run_id, rolled_back)
        if result.rollback.rolled_back and rolled_back is None:
            rolled_back = (
                f"check of {day}: v{result.rollback.champion_before} -> v{result.rollback.champion_after}"
            )
        results.append(result)
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
