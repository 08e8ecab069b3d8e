"""A version's operating point (model_contract/operating_point.py): the threshold chosen on the holdout for a
decline rate, with ties, weights and tags that anyone with MLflow access could have written."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model_contract.operating_point import (
    OperatingPointTagError,
    choose,
    decline_rate,
    from_metrics,
    from_tags,
    threshold_for_rate,
)


def test_the_threshold_declines_at_most_the_target_share_and_takes_ties_whole():
    scores = np.array([0.9, 0.8, 0.8, 0.7, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    assert threshold_for_rate(scores, 0.1) == 0.9  # one of ten
    assert threshold_for_rate(scores, 0.2) == 0.9  # 0.8 twice would make three of ten
    assert threshold_for_rate(scores, 0.3) == 0.8
    assert threshold_for_rate(scores, 0.45) == 0.7
    # even the highest score alone is over the share: nothing is declined
    above = threshold_for_rate(scores, 0.05)
    assert above > 0.9 and decline_rate(scores, above) == 0.0


def test_the_share_is_of_the_population_the_weights_stand_for():
    """The holdout's negatives are sampled (weight 10 each here): a share of rows is no share of traffic."""
    scores = np.array([0.9, 0.6, 0.5, 0.4])
    weights = np.array([1.0, 10.0, 10.0, 10.0])
    assert threshold_for_rate(scores, 0.05, weights) == 0.9  # 1 of 31
    assert threshold_for_rate(scores, 0.36, weights) == 0.6  # 11 of 31
    assert decline_rate(scores, 0.6, weights) == pytest.approx(11 / 31)


def test_the_point_records_precision_and_recall_at_its_threshold_and_the_review_band_below_it():
    labels = np.array([1, 1, 0, 1, 0, 0, 0, 0, 0, 0])
    scores = np.array([0.95, 0.9, 0.85, 0.4, 0.3, 0.2, 0.15, 0.1, 0.05, 0.01])
    point = choose(labels, scores, 0.3, review_rate=0.2)
    assert point.threshold == 0.85 and point.decline_rate == pytest.approx(0.3)
    assert point.precision == pytest.approx(2 / 3) and point.recall == pytest.approx(2 / 3)
    assert point.review_threshold == 0.3  # two more of ten: 0.4 and 0.3
    assert from_tags(point.tags()) == point
    assert from_metrics(point.metrics()) == point
    assert choose(labels, scores, 0.3).review_threshold is None


@pytest.mark.parametrize(
    ("tags", "message"),
    [
        ({"operating_point.threshold": "abc"}, "operating_point.threshold is 'abc', not a number"),
        ({"operating_point.threshold": "0"}, "not in (0, 1]"),
        ({"operating_point.threshold": "1.5"}, "not in (0, 1]"),
        ({"operating_point.threshold": "nan"}, "not in (0, 1]"),
        ({"operating_point.threshold": "0.5", "operating_point.review_threshold": "0.7"}, "review_threshold"),
    ],
)
def test_tags_that_cannot_be_a_threshold_are_refused_by_name(tags, message):
    with pytest.raises(OperatingPointTagError) as refused:
        from_tags(tags)
    assert message in str(refused.value)


def test_a_version_without_a_point_has_none_and_a_nan_score_is_declined():
    assert from_tags({"lineage.commit": "abc"}) is None and from_tags(None) is None
    assert decline_rate(np.array([math.nan, 0.1]), 0.5) == 0.5
