"""Drift tests (monitoring/drift.py) on tiny inline data, with PSI computed by hand, and the rollback rule
(monitoring/check.py rollback_decision): pure functions, no services."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from core.settings import MonitoringSettings
from monitoring.drift import (
    EPSILON,
    bin_shares,
    categorical_drift,
    categorical_psi,
    drift_report,
    ks_statistic,
    numeric_drift,
    psi,
    quantile_edges,
)

POLICY = MonitoringSettings(psi_threshold=0.2, ks_threshold=0.1, min_drifted=2, min_rows=100, bins=10)
NAN = float("nan")


def test_psi_of_a_tiny_example_matches_the_hand_computation():
    # bins=2: one edge at the reference's median 2.5 -> shares (0.5, 0.5); the current (0.75, 0.25)
    # PSI = (0.75 - 0.5) ln(0.75 / 0.5) + (0.25 - 0.5) ln(0.25 / 0.5) = 0.25 ln 1.5 + 0.25 ln 2
    reference, current = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.0, 1.0, 1.0, 4.0])
    assert quantile_edges(reference, 2).tolist() == [2.5]
    assert bin_shares(current, np.array([2.5])).tolist() == [0.75, 0.25, 0.0]  # last: the null bin
    assert psi(reference, current, bins=2) == pytest.approx(0.25 * math.log(1.5) + 0.25 * math.log(2))


def test_bins_are_right_closed():
    assert bin_shares(np.array([2.5, 2.5000001]), np.array([2.5])).tolist() == [0.5, 0.5, 0.0]


def test_identical_distributions_give_zero():
    values = np.random.default_rng(1).normal(size=1000)
    assert psi(values, values, bins=10) == 0.0
    assert ks_statistic(values, values) == 0.0
    assert not numeric_drift("x", values, values, POLICY).drifted


def test_a_shifted_normal_drifts_and_a_fresh_sample_of_the_same_does_not():
    rng = np.random.default_rng(2)
    reference = rng.normal(size=5000)
    same = numeric_drift("x", reference, rng.normal(size=2000), POLICY)
    shifted = numeric_drift("x", reference, rng.normal(loc=0.8, size=2000), POLICY)
    assert not same.drifted and same.psi < 0.05 and same.ks < 0.05
    assert shifted.drifted and shifted.psi > 0.4 and shifted.ks > 0.25
    assert shifted.describe() == f"x PSI {shifted.psi:.2f} KS {shifted.ks:.2f}"


def test_both_tests_must_agree_for_a_numeric_input():
    """A small shift that KS flags on thousands of rows but PSI rates minor is not drift by itself."""
    rng = np.random.default_rng(3)
    found = numeric_drift("x", rng.normal(size=20_000), rng.normal(loc=0.3, size=5000), POLICY)
    assert found.ks > POLICY.ks_threshold
    assert found.psi < POLICY.psi_threshold
    assert not found.drifted


@pytest.mark.parametrize(
    ("current", "drifted"),
    [(np.full(200, 3.0), False), (np.full(200, 4.0), True), (np.full(200, 2.0), True)],
    ids=["same-constant", "shifted-up", "shifted-down"],
)
def test_a_constant_feature_gets_a_bin_below_at_and_above_its_value(current, drifted):
    reference = np.full(500, 3.0)
    assert len(quantile_edges(reference, 10)) == 2  # three bins, plus nulls
    found = numeric_drift("c", reference, current, POLICY)
    assert found.drifted is drifted
    if not drifted:
        assert found.psi == 0.0 and found.ks == 0.0
    else:  # all the mass moves into a bin the reference left empty: finite, by the epsilon
        assert found.psi == pytest.approx(2 * (1 - EPSILON) * math.log(1 / EPSILON))


def test_a_tied_discrete_feature_collapses_its_edges():
    reference = np.array([0.0] * 80 + [1.0] * 20)
    edges = quantile_edges(reference, 10)
    assert len(edges) == len(set(edges)) < 9
    assert psi(reference, reference[::-1], bins=10) == 0.0


def test_nulls_are_a_bin_of_their_own_and_rank_below_every_value_for_ks():
    reference = np.array([1.0, 2.0, 3.0, 4.0])
    current = np.array([1.0, 2.0, NAN, NAN])
    # bins=2 on the non-null reference: (0.5, 0.5, null 0); current (0.5, 0, null 0.5)
    expected = 2 * (0.5 - EPSILON) * math.log(0.5 / EPSILON)
    assert psi(reference, current, bins=2) == pytest.approx(expected)
    # nulls below 1.0: the current CDF is 0.5 at "null", the reference's 0 -> KS 0.5
    assert ks_statistic(reference, current) == pytest.approx(0.5)
    found = numeric_drift("x", reference, current, POLICY)
    assert (found.null_share, found.reference_null_share) == (0.5, 0.0)
    assert found.drifted


def test_an_input_null_on_both_sides_has_not_drifted():
    found = numeric_drift("x", np.full(300, NAN), np.full(200, NAN), POLICY)
    assert found.psi == 0.0 and not found.drifted


def test_categorical_psi_by_hand_with_a_new_value_and_nulls():
    reference = pd.Series(["pos"] * 6 + ["online"] * 4)
    current = pd.Series(["pos"] * 4 + ["online"] * 4 + ["atm"] + [None])
    # shares pos .6/.4, online .4/.4, atm 0/.1, null 0/.1 (0 floored at EPSILON)
    expected = (0.4 - 0.6) * math.log(0.4 / 0.6) + 0.0 + 2 * (0.1 - EPSILON) * math.log(0.1 / EPSILON)
    assert categorical_psi(reference, current) == pytest.approx(expected)
    assert categorical_psi(reference, reference.sample(frac=1.0, random_state=0)) == 0.0
    found = categorical_drift("channel", reference, current, POLICY)
    assert found.drifted and found.ks is None and found.null_share == 0.1


def test_the_verdict_needs_min_rows_and_min_drifted_inputs():
    rng = np.random.default_rng(4)
    reference = rng.normal(size=3000)
    drifted = numeric_drift("a", reference, rng.normal(loc=1.0, size=1000), POLICY)
    steady = numeric_drift("b", reference, rng.normal(size=1000), POLICY)
    also = numeric_drift("c", reference, rng.normal(loc=-1.0, size=1000), POLICY)

    one = drift_report([drifted, steady], 1000, 3000, POLICY)
    assert one.verdict == "no_drift" and [i.name for i in one.drifted] == ["a"]
    two = drift_report([drifted, steady, also], 1000, 3000, POLICY)
    assert two.verdict == "drift" and "2 of 3 inputs drifted" in two.reason
    assert drift_report([drifted, also], 99, 3000, POLICY).verdict == "insufficient"
    assert drift_report([drifted, also], 1000, 50, POLICY).verdict == "insufficient"


# --- the rollback rule -----------------------------------------------------------------------------------


def _compared(champion: float, previous: float, low: float, high: float):
    from monitoring.check import Comparison

    return Comparison("2", "1", "its shadow scores", 900, 40, champion, previous, low, high)


@pytest.mark.parametrize(
    ("comparison", "roll", "says"),
    [
        (
            _compared(0.40, 0.80, 0.31, 0.49),
            True,
            "down 0.4000, 90% interval [0.3100, 0.4900]: more than 0.05 and significant",
        ),
        (
            _compared(0.77, 0.80, -0.01, 0.07),
            False,
            "down 0.0300, 90% interval [-0.0100, 0.0700]: within 0.05",
        ),
        (_compared(0.70, 0.80, -0.02, 0.21), False, "more than 0.05, but not significant"),
        (_compared(0.80, 0.70, -0.15, -0.05), False, "down -0.1000"),
    ],
    ids=["worse", "within-margin", "not-significant", "better"],
)
def test_the_rollback_rule(comparison, roll, says):
    from monitoring.check import rollback_decision

    decided, reason = rollback_decision(comparison, 0.05, 0.9)
    assert decided is roll
    assert says in reason, reason
    assert "v2" in reason and "v1" in reason and "same 900 confirmed, approved" in reason


def test_the_paired_bootstrap_interval_covers_the_drop_it_measures():
    from monitoring.check import paired_bootstrap
    from training.metrics import average_precision

    rng = np.random.default_rng(3)
    labels = (rng.random(3000) < 0.05).astype(int)
    strong = labels * 0.5 + rng.random(3000)
    weak = labels * 0.1 + rng.random(3000)
    drop = average_precision(labels, strong) - average_precision(labels, weak)
    low, high = paired_bootstrap(labels, weak, strong, 300, 0.9, seed=1)
    assert 0 < low < drop < high
    same_low, same_high = paired_bootstrap(labels, strong, strong, 300, 0.9, seed=1)
    assert same_low == same_high == 0.0
    noise_low, noise_high = paired_bootstrap(labels, rng.random(3000), rng.random(3000), 300, 0.9, seed=1)
    assert noise_low < 0 < noise_high
