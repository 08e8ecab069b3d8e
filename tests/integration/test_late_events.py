"""Late, out-of-order and re-delivered arrivals reach gold by event date, and the features stage rebuilds
every date they change (gold, its DVC version, the online store), on real Spark, GX, DVC and Feast.

The reference is a rebuild from scratch: whatever order the arrivals came in, the gold the features stage
kept must be byte for byte the gold that building every event date anew from the final silver gives, and
the online store must hold each entity's latest gold row.
"""

from __future__ import annotations

import shutil
from datetime import date, timedelta

from core.settings import Settings, get_settings
from mlops import chain
from pipelines.ingest import job as ingest
from pipelines.synthetic.faults import parse_faults
from pipelines.synthetic.landing import GenerateRequest, generate_landing
from tests.integration.gold_checks import (
    assert_gold_is_a_rebuild_from_scratch,
    assert_online_holds_latest_gold,
    assert_training_set_is_the_full_join,
    counts_by_event_date,
    gold_tables,
    silver_by_event_date,
)

FIRST = date(2026, 2, 2)
DAYS = [FIRST + timedelta(days=i) for i in range(3)]


def _land(settings: Settings, faults: str = "") -> list[dict]:
    return generate_landing(
        GenerateRequest(
            start=FIRST,
            days=len(DAYS),
            rows_per_day=400,
            seed=7,
            landing=settings.landing,
            customers=50,
            merchants=25,
            faults=parse_faults(faults),
        )
    )


def _arrive(settings: Settings, day: date) -> dict:
    """One arrival through ingestion and the features stage, as the DAG chain runs them."""
    ingest.ingest(settings, day, "t")
    return chain.features(settings, day)


def test_late_events_reach_gold_and_rebuild_the_dates_they_touch(spark, tmp_path):
    settings = get_settings()
    manifests = _land(settings, faults="late=0.03")
    held_back = [m["faults"]["late"] for m in manifests]
    assert held_back[0] > 0 and manifests[1]["late_from_previous_date"] == held_back[0]

    _arrive(settings, DAYS[0])
    second = _arrive(settings, DAYS[1])  # carries events of DAYS[0]
    # The late events make gold of DAYS[0] stale: the run rebuilds it, and DAYS[1] reads it as lookback.
    assert second["plan"]["event_dates"] == [DAYS[0].isoformat(), DAYS[1].isoformat()]
    assert DAYS[0].isoformat() in second["rebuilt"]
    _arrive(settings, DAYS[2])

    silver = silver_by_event_date(settings)
    # Every silver transaction, late ones included, has one gold row on its event date.
    assert counts_by_event_date(gold_tables(settings)[0]) == silver
    assert counts_by_event_date(gold_tables(settings)[1]) == silver
    late_rows = sum(m["late_from_previous_date"] for m in manifests[1:])
    assert sum(silver.values()) == sum(m["transactions"]["rows_written"] for m in manifests)
    assert late_rows > 0
    assert_gold_is_a_rebuild_from_scratch(settings, tmp_path)
    assert_online_holds_latest_gold(settings)
    # The rows of the rebuilt date were rebuilt with its gold: a training set reads what the join gives.
    assert DAYS[0].isoformat() in second["training_rows"]["built"]
    assert assert_training_set_is_the_full_join(settings, DAYS[2], window_days=3)["built"] == []


def test_out_of_order_and_redelivered_arrivals_rebuild_downstream_gold(spark, tmp_path):
    settings = get_settings()
    _land(settings)
    _arrive(settings, DAYS[0])
    _arrive(settings, DAYS[2])  # before DAYS[1]: its lookback lacks DAYS[1] for now
    record = _arrive(settings, DAYS[1])
    assert record["plan"]["event_dates"] == [DAYS[1].isoformat(), DAYS[2].isoformat()]
    assert record["plan"]["reasons"][DAYS[2].isoformat()].startswith("inputs changed")
    assert record["training_rows"]["built"] == [DAYS[1].isoformat(), DAYS[2].isoformat()]
    assert_gold_is_a_rebuild_from_scratch(settings, tmp_path / "out-of-order")
    assert_training_set_is_the_full_join(settings, DAYS[2], window_days=3)

    # The producer re-delivers the first date with its last 40 rows withdrawn; every later date read it.
    data = next((settings.landing / DAYS[0].isoformat()).glob("transactions-*.csv"))
    lines = data.read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:-40]))
    record = _arrive(settings, DAYS[0])
    assert record["plan"]["event_dates"] == [d.isoformat() for d in DAYS]
    assert counts_by_event_date(gold_tables(settings)[0]) == silver_by_event_date(settings)
    assert_gold_is_a_rebuild_from_scratch(settings, tmp_path / "redelivered")
    assert_online_holds_latest_gold(settings)
    assert record["training_rows"]["built"] == [d.isoformat() for d in DAYS]
    assert_training_set_is_the_full_join(settings, DAYS[2], window_days=2)
    # A lake whose rows were never built (built before they existed): the training set builds them.
    shutil.rmtree(settings.lake / "training_rows")
    shutil.rmtree(settings.lake / "state" / "training_rows")
    assert_training_set_is_the_full_join(settings, DAYS[2], window_days=3)
