"""The monitor's rules that need no traffic: the `estimate_drop` alert's threshold and the alert of an alias
moved outside the promotion history (monitoring/check.py `alerts_of`), and the one-rollback-per-run guard
(`apply_rollback_rule`), on a promotion history in SQLite."""

from __future__ import annotations

from datetime import date

import pytest

from core.settings import MonitoringSettings, Settings
from monitoring.check import CheckResult, RollbackOutcome, alerts_of, apply_rollback_rule
from monitoring.drift import DriftReport
from monitoring.performance import LabelCompleteness, LivePerformance

DAY = date(2026, 1, 8)


def _performance(complete: bool = True) -> LivePerformance:
    completeness = LabelCompleteness(complete, "labels as the history says", 40, 41.0, 9000, 400)
    return LivePerformance(DAY, DAY, DAY, 5000, 40, (), completeness=completeness)


def _result(estimate: dict | None, alias: dict | None = None) -> CheckResult:
    return CheckResult(
        check_id="check-1",
        day=DAY,
        model_name="fraud-detector",
        champion_version="3",
        feature_source="gold",
        drift=DriftReport("no_drift", (), 5000, 20000, "no input drifted"),
        performance=_performance(),
        rollback=RollbackOutcome(False, "no verdict"),
        estimate=estimate,
        alias=alias,
    )


def _estimate(now: float, holdout: float) -> dict:
    return {
        "version": "3",
        "estimate": {"auc_pr": now},
        "calibration": {"holdout_auc_pr": holdout},
        "reliable": True,
        "reliability": "its scores imply the holdout's fraud rate",
    }


@pytest.mark.parametrize(
    ("now", "fires"),
    [(0.49, True), (0.5, False), (0.55, False), (0.7, False)],
    ids=["beyond the allowed drop", "exactly at it", "within it", "above the holdout"],
)
def test_the_estimate_drop_alert_fires_only_beyond_the_allowed_drop(now, fires):
    alerts = alerts_of(_result(_estimate(now, holdout=0.6)), max_estimate_drop=0.1)
    dropped = [a for a in alerts if a.kind == "estimate_drop"]
    assert bool(dropped) is fires, alerts
    if fires:
        assert "v3" in dropped[0].subject and f"{now:.4f}" in dropped[0].text
        assert dropped[0].details["check_id"] == "check-1" and dropped[0].details["version"] == "3"


def test_no_estimate_no_estimate_alert():
    assert [a.kind for a in alerts_of(_result(None))] == []


def test_an_alias_moved_outside_the_history_is_alerted_and_one_in_step_is_not():
    moved = alerts_of(_result(None, {"alias": "4", "recorded": "3", "out_of_band": True}))
    assert [a.kind for a in moved] == ["alias_out_of_band"]
    assert "v4 (history: v3)" in moved[0].subject and "mlops promote" in moved[0].text
    assert moved[0].details["alias"] == "4" and moved[0].details["check_id"] == "check-1"
    in_step = {"alias": "3", "recorded": "3", "out_of_band": False}
    assert [a.kind for a in alerts_of(_result(None, in_step))] == []


def _history(settings: Settings, champions: list[str]) -> None:
    """Promotions by hand of `champions`, in order, written to the settings' promotion history."""
    from training.ledger import Decision, Ledger

    ledger = Ledger(settings.promotion_ledger_url)
    ledger.create()
    try:
        before = None
        for version in champions:
            with ledger.exclusive("fraud-detector") as conn:
                ledger.append(
                    conn,
                    Decision(
                        model_name="fraud-detector", action="manual", decision="promoted", reason="set-up",
                        candidate_version=version, champion_before=before, champion_after=version,
                    ),
                )  # fmt: skip
                ledger.commit(conn)
            before = version
    finally:
        ledger.dispose()


def test_one_rollback_a_run_the_second_check_of_a_run_does_not_roll_back(tmp_path):
    settings = Settings(home=tmp_path, monitoring=MonitoringSettings(rollback_cooldown_hours=0))
    settings.ensure_dirs()
    _history(settings, ["1", "2"])
    # without an earlier rollback in the run, the rule goes on to compare the two versions (no rows here)
    first = apply_rollback_rule(settings, DAY, "2", _performance(), "monitor_fraud_model", "r1")
    assert not first.rolled_back and "labelled frauds" in first.reason, first
    # the run already rolled back in an earlier date's check: this one stops there, whatever the figures
    done = "check of 2026-01-07: v3 -> v2"
    second = apply_rollback_rule(settings, DAY, "2", _performance(), "monitor_fraud_model", "r1", done)
    assert second == RollbackOutcome(False, f"this run already rolled back ({done}): one rollback a run")
    # labels that are not complete yet come first: no verdict at all, guard or not
    early = apply_rollback_rule(settings, DAY, "2", _performance(False), "monitor_fraud_model", "r1", done)
    assert early.reason == "labels as the history says" and not early.rolled_back
