"""The gate's decision rule and the promotion history, without MLflow: pure functions and a SQLite ledger."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from training.ledger import Decision, Ledger, champion_stack
from training.registry import GatePolicy, gate_decision

POLICY = GatePolicy(
    margin=0.01,
    floor=0.2,
    max_roc_auc_drop=0.02,
    max_recall_drop=0.05,
    max_latency_ms=5.0,
    max_decline_rate_change=0.02,
    target_decline_rate=0.01,
)
CHAMPION = {"auc_pr": 0.50, "roc_auc": 0.90, "recall_at_1pct_fpr": 0.60}


def metrics(auc_pr: float, roc_auc: float = 0.90, recall: float = 0.60) -> dict:
    return {"auc_pr": auc_pr, "roc_auc": roc_auc, "recall_at_1pct_fpr": recall}


def declining(auc_pr: float, rate: float, threshold: float = 0.4) -> dict:
    return {**metrics(auc_pr), "decline_rate": rate, "threshold": threshold}


DECLINING = {**CHAMPION, "decline_rate": 0.01, "threshold": 0.5}


@pytest.mark.parametrize(
    ("candidate", "champion", "latency", "promoted", "reason"),
    [
        (metrics(0.30), None, 1.0, True, "clears the floor"),
        (metrics(0.19), None, 1.0, False, "below the floor"),
        (metrics(0.52), CHAMPION, 1.0, True, "beats the champion"),
        (metrics(0.505), CHAMPION, 1.0, False, "does not beat"),  # better, but within the margin
        (metrics(0.40), CHAMPION, 1.0, False, "does not beat"),  # worse
        (metrics(0.60, roc_auc=0.85), CHAMPION, 1.0, False, "guardrail: roc_auc"),
        (metrics(0.60, recall=0.50), CHAMPION, 1.0, False, "guardrail: recall_at_1pct_fpr"),
        (metrics(0.60), CHAMPION, 6.0, False, "latency"),
        (metrics(0.30), None, 6.0, False, "latency"),
        # a diverged model scores NaN; every comparison with NaN is false, so each must be refused by name
        (metrics(float("nan")), None, 1.0, False, "candidate's holdout metrics are not finite (auc_pr nan)"),
        (metrics(float("nan")), CHAMPION, 1.0, False, "candidate's holdout metrics are not finite"),
        (metrics(0.60, roc_auc=float("nan")), CHAMPION, 1.0, False, "not finite (roc_auc nan)"),
        (metrics(0.60, recall=float("inf")), CHAMPION, 1.0, False, "recall_at_1pct_fpr inf"),
        (metrics(0.60), metrics(float("nan")), 1.0, False, "champion's holdout metrics are not finite"),
        (metrics(0.60), CHAMPION, float("nan"), False, "latency nan ms is not a finite number"),
        # each at its own threshold on the same transactions: a change of the decline rate is reported, and
        # one beyond the bound refused whatever the AUC-PR gained
        (declining(0.60, 0.015), DECLINING, 1.0, True, "decline rate 1.00% -> 1.50% on the same"),
        (declining(0.60, 0.035), DECLINING, 1.0, False, "decline rate 1.00% -> 3.50% on the same"),
        (declining(0.60, 0.035), DECLINING, 1.0, False, "moves by more than 2.00%"),
        (declining(0.60, float("nan")), DECLINING, 1.0, False, "moves by more than"),
        # a bigger move back toward the target (the champion's threshold went stale on today's traffic)
        (
            declining(0.60, 0.012),
            {**DECLINING, "decline_rate": 0.035},
            1.0,
            True,
            "back toward the target of 1.00%",
        ),
        (declining(0.60, 0.035), DECLINING, 1.0, False, "not toward the target of 1.00%"),
        # a candidate without an operating point of its own decides at the global threshold: reported only
        (
            {**declining(0.60, 0.035), "own_threshold": 0.0},
            DECLINING,
            1.0,
            True,
            "decline rate 1.00% -> 3.50%",
        ),
    ],
)
def test_gate_decision(candidate, champion, latency, promoted, reason):
    decided, why = gate_decision(candidate, champion, latency, POLICY)
    assert decided is promoted
    assert reason in why


def _row(decision: str, after: str | None, before: str | None = None) -> Decision:
    return Decision("m", "gate", decision, "r", after, before, after)


def test_champion_stack_replays_promotions_and_rollbacks():
    history = [
        _row("promoted", "1"),
        _row("rejected", "1"),
        _row("promoted", "3", "1"),
        _row("promoted", "4", "3"),
        Decision("m", "rollback", "rolled_back", "r", "4", "4", "3"),
    ]
    assert champion_stack(history) == ["1", "3"]
    assert champion_stack(history[:4]) == ["1", "3", "4"]
    assert champion_stack([]) == []


@pytest.fixture
def ledger(tmp_path):
    ledger = Ledger(f"sqlite:///{tmp_path / 'promotions.db'}")
    yield ledger
    ledger.dispose()


def test_ledger_appends_in_order_and_reads_back_metrics(ledger):
    with ledger.exclusive("fraud-detector") as conn:
        first = ledger.append(
            conn, Decision("fraud-detector", "gate", "promoted", "first", "1", None, "1", {"auc_pr": 0.3})
        )
    with ledger.exclusive("fraud-detector") as conn:
        ledger.append(
            conn, Decision("fraud-detector", "gate", "rejected", "worse", "2", "1", "1", {"auc_pr": 0.1})
        )
    rows = ledger.history("fraud-detector")
    assert [r.candidate_version for r in rows] == ["1", "2"]
    assert rows[0].id == first.id
    assert rows[1].candidate_metrics == {"auc_pr": 0.1}
    assert rows[0].recorded_at <= rows[1].recorded_at
    assert ledger.history("another-model") == []


def test_ledger_refuses_to_rewrite_history(ledger):
    with ledger.exclusive("m") as conn:
        ledger.append(conn, _row("promoted", "1"))
    with pytest.raises(sa.exc.DatabaseError, match="append-only"), ledger.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE promotion_history SET decision = 'rejected'")
    with pytest.raises(sa.exc.DatabaseError, match="append-only"), ledger.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM promotion_history")
    assert [r.decision for r in ledger.history("m")] == ["promoted"]


def test_a_failed_block_leaves_no_history_row(ledger):
    with pytest.raises(RuntimeError, match="alias"), ledger.exclusive("m") as conn:
        ledger.append(conn, _row("promoted", "1"))
        raise RuntimeError("moving the alias failed")
    assert ledger.history("m") == []


def test_recall_at_fpr_counts_positives_above_the_negatives_quantile():
    import numpy as np

    from training.metrics import recall_at_fpr

    negatives = np.linspace(0.0, 0.99, 100)  # the 1% threshold sits at 0.99
    labels = np.array([0] * 100 + [1] * 4)
    scores = np.concatenate([negatives, [0.995, 0.999, 0.5, 0.1]])
    assert recall_at_fpr(labels, scores, 0.01) == 0.5
    assert recall_at_fpr(np.zeros(3), np.ones(3), 0.01) == 0.0


def test_weighted_holdout_metrics_equal_the_metrics_of_the_rows_they_stand_for():
    """A sampled holdout (each kept legitimate row weighs 1 / rate) scores like the population it stands
    for: here exactly, with every legitimate row standing for three identical ones."""
    import numpy as np

    from training.metrics import evaluate

    rng = np.random.default_rng(3)
    labels = (rng.random(4_000) < 0.05).astype(int)
    scores = np.clip(rng.normal(0.3 + 0.4 * labels, 0.2), 0, 1)
    weights = np.where(labels == 1, 1.0, 3.0)
    copies = weights.astype(int)
    expanded = evaluate(np.repeat(labels, copies), np.repeat(scores, copies))
    weighted = evaluate(labels, scores, weights=weights)
    for metric in ("auc_pr", "roc_auc", "precision", "recall", "f1", "brier"):
        assert weighted[metric] == pytest.approx(expanded[metric], rel=1e-9), metric
    assert weighted["recall_at_1pct_fpr"] == pytest.approx(expanded["recall_at_1pct_fpr"], abs=0.01)
    assert weighted["population_rows"] == expanded["rows"] and weighted["rows"] == len(labels)
    assert evaluate(labels, scores)["auc_pr"] > weighted["auc_pr"]  # fewer negatives flatter precision


def test_the_metrics_of_non_finite_scores_are_nan_and_counted_not_a_scikit_learn_error():
    import math

    import numpy as np

    from training.metrics import evaluate

    labels = np.array([0, 1, 0, 1])
    values = evaluate(labels, np.array([0.1, float("nan"), 0.2, 0.9]))
    assert values["non_finite_scores"] == 1.0
    assert math.isnan(values["auc_pr"]) and math.isnan(values["roc_auc"])
    decided, why = gate_decision(values, None, 1.0, POLICY)
    assert decided is False and "not finite" in why
