"""Late, out-of-order and re-delivered arrivals reach gold by event date, and the features stage rebuilds
every date they change (gold, its DVC version, the online store, the training rows), on real Spark, GX, DVC
and Feast.

The arrivals are the reference lake's (tests/lake.py), built once per run through the same steps the DAGs
run: 03-03 is delivered before 03-02 and 03-05 before 03-04, every date's file carries late events of the
date before it, and 03-03 is re-delivered at the end with rows withdrawn. Its record says what each
features run planned and built; these tests hold those plans to what the arrivals changed.

The reference for the lake's state is a rebuild from scratch: whatever order the arrivals came in, the gold
the features stage kept must be byte for byte the gold that building every event date anew from silver
gives. It is checked on the lake as it stood after every date's first arrival, before the re-delivery
rebuilds the later dates (which would hide a wrong rebuild of theirs), and on the end state
(test_reference_lake.py, with the online store).
"""

from __future__ import annotations

import itertools
import shutil
from datetime import date, timedelta

from core.settings import Settings
from pipelines.lake import Tables, read_json
from tests import lake as reference
from tests.integration.gold_checks import (
    assert_gold_is_a_rebuild_from_scratch,
    assert_training_set_is_the_full_join,
    counts_by_event_date,
    gold_tables,
    silver_by_event_date,
)


def _record(events: dict, arrival: date, kind: str = "first") -> dict:
    """The features run's record for `arrival` (its first delivery, the late labels or the re-delivery)."""
    return next(r for r in events["records"] if r["arrival"] == arrival.isoformat() and r["kind"] == kind)


def _isoformat(days) -> list[str]:
    return [d.isoformat() for d in days]


def test_late_events_reach_gold_and_rebuild_the_dates_they_touch(spark, tmp_path):
    phase = reference.reference_lake(tmp_path / "home", phase="arrivals")
    events = phase.events
    delivered = [date.fromisoformat(d) for d in events["delivered"]]
    manifests = {m["arrival_date"]: m for m in events["manifests"]}
    touched_after_built = []
    for carrier in reference.DAYS[1:]:
        touched = carrier - timedelta(days=1)
        assert manifests[carrier.isoformat()]["late_from_previous_date"] > 0, carrier
        record = _record(events, carrier)
        # The arrival holds events of the date before it: that date's gold is (re)built in the same run, and
        # its training rows with it.
        assert touched.isoformat() in record["plan"]["event_dates"], record["plan"]
        reason = record["plan"]["reasons"][touched.isoformat()]
        assert reason == f"events of arrival {carrier}", record["plan"]
        assert touched.isoformat() in record["rebuilt"], record
        assert touched.isoformat() in record["training_rows"]["built"], record
        if delivered.index(touched) < delivered.index(carrier):
            touched_after_built.append(touched)
    assert touched_after_built, "the feed must carry late events of a date whose gold was already built"

    # Every silver transaction, late ones included, has one gold row on its event date, and none is lost:
    # silver holds every row delivered but the exact re-sends and those quarantined (the last date's late
    # events would come with the next date, which is not delivered).
    settings = Settings(home=phase.home)
    silver = silver_by_event_date(settings)
    assert counts_by_event_date(gold_tables(settings)[0]) == silver
    assert counts_by_event_date(gold_tables(settings)[1]) == silver
    tables = Tables(settings.lake)
    quarantined = sum(read_json(tables.reconciliation(d))["rows_quarantined"] for d in reference.DAYS)
    assert quarantined > 0
    delivered_rows = sum(
        m["transactions"]["rows_written"] - m["faults"]["duplicates"] for m in events["manifests"]
    )
    assert sum(silver.values()) == delivered_rows - quarantined
    # The rows of the rebuilt dates were rebuilt with their gold: a training set reads what the join gives.
    assert assert_training_set_is_the_full_join(settings, reference.DAYS[-1], window_days=4)["built"] == []


def test_out_of_order_and_redelivered_arrivals_rebuild_downstream_gold(spark, tmp_path):
    phase = reference.reference_lake(tmp_path / "arrivals", phase="arrivals")
    events = phase.events
    delivered = [date.fromisoformat(d) for d in events["delivered"]]
    # A date delivered after the next one: the next date read a lookback without it, so it is rebuilt.
    came_late = next(after for day, after in itertools.pairwise(delivered) if after < day)
    following = came_late + timedelta(days=1)
    record = _record(events, came_late)
    assert record["plan"]["event_dates"] == _isoformat([came_late, following])
    assert record["plan"]["reasons"][following.isoformat()].startswith("inputs changed"), record["plan"]
    assert record["training_rows"]["built"] == _isoformat([came_late, following])
    settings = Settings(home=phase.home)
    assert_gold_is_a_rebuild_from_scratch(settings, tmp_path / "after-arrivals")
    # The training set of this same arrivals lake is the full join: the test above asserts it (line 80).

    # The producer re-delivers a date with its last rows withdrawn: its date and every later one (which read
    # it) are rebuilt, and an earlier date only for the chargebacks the re-delivery reported on it.
    record = _record(events, reference.REDELIVERED, "redelivery")
    plan = record["plan"]
    later = _isoformat(d for d in reference.DAYS if d >= reference.REDELIVERED)
    assert plan["event_dates"][-len(later) :] == later, plan
    for day in plan["event_dates"][: -len(later)]:
        assert plan["reasons"][day] == f"inputs changed: arrivals {reference.REDELIVERED}", plan
    assert record["training_rows"]["built"] == plan["event_dates"]
    end = reference.reference_lake(tmp_path / "home")
    settings = Settings(home=end.home)
    assert counts_by_event_date(gold_tables(settings)[0]) == silver_by_event_date(settings)
    assert_training_set_is_the_full_join(settings, reference.DAYS[-1], window_days=2)
    # A lake whose rows were never built (built before they existed): the training set builds them.
    shutil.rmtree(settings.lake / "training_rows")
    shutil.rmtree(settings.lake / "state" / "training_rows")
    assert_training_set_is_the_full_join(settings, reference.DAYS[-1], window_days=4)
