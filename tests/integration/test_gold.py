"""Gold features from silver on the real engines: point-in-time correctness against a brute-force
recomputation, no label leakage, the gold GX suites, and identical gold on rerun."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import pytest

from core.errors import PipelineError
from core.settings import Settings
from pipelines.contracts import CURRENCY_PER_USD
from pipelines.gold import job as gold
from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, table_path
from tests import lake as reference

LAST = reference.DAYS[-1]


@pytest.fixture(scope="module")
def lake(tmp_path_factory, spark):
    """A copy of the reference lake (tests/lake.py: late, out-of-order, re-delivered and quarantined rows),
    with gold of its last date built again here: the record is this build's."""
    copy = reference.reference_lake(tmp_path_factory.mktemp("gold") / "home")
    settings = Settings(home=copy.home, spark_shuffle_partitions=2)
    record = gold.build_gold(settings, LAST)
    return settings, record


def _gold(spark, settings, table):
    return spark.read.parquet(str(table_path(settings.lake, table))).where(f"event_date = '{LAST}'")


def test_gold_has_one_row_per_transaction_of_the_date_and_passes_its_suites(spark, lake):
    settings, record = lake
    # by event date: the date's late rows arrived with the next date, and gold holds them on their own
    silver = spark.read.parquet(str(settings.lake / "silver" / "transactions")).where(
        f"event_date = '{LAST}'"
    )
    assert record[f"rows_{CUSTOMER_TABLE}"] == record[f"rows_{MERCHANT_TABLE}"] == silver.count() > 0
    results = gold.validate_gold(settings, LAST)
    assert [r["success"] for r in results] == [True, True]


def test_customer_features_equal_a_brute_force_point_in_time_recomputation(spark, lake):
    settings, _ = lake
    silver = spark.read.parquet(str(settings.lake / "silver" / "transactions")).collect()
    features = _gold(spark, settings, CUSTOMER_TABLE).orderBy("customer_id", "event_timestamp").collect()
    history: dict[str, list] = {}
    for row in silver:
        history.setdefault(row.customer_id, []).append(row)
    for row in features[::37]:  # a deterministic sample
        t = row.event_timestamp
        for name, width in (
            ("1h", timedelta(hours=1)),
            ("24h", timedelta(days=1)),
            ("7d", timedelta(days=7)),
        ):
            window = [h for h in history[row.customer_id] if t - width < h.event_timestamp <= t]
            assert row[f"customer_txn_count_{name}"] == len(window), (row.customer_id, t, name)
            usd = sum(float(h.amount) / CURRENCY_PER_USD[h.currency] for h in window)
            assert row[f"customer_amount_sum_{name}"] == pytest.approx(usd, rel=1e-9)
        earlier = [h.event_timestamp for h in history[row.customer_id] if h.event_timestamp < t]
        if earlier:
            assert row.customer_seconds_since_previous == pytest.approx((t - max(earlier)).total_seconds())
        assert row.created_timestamp == datetime(LAST.year, LAST.month, LAST.day) + timedelta(days=1)


def test_merchant_chargebacks_count_only_labels_reported_by_the_event_time(spark, lake):
    settings, _ = lake
    labels = spark.read.parquet(str(settings.lake / "silver" / "labels"))
    transactions = spark.read.parquet(str(settings.lake / "silver" / "transactions")).select(
        "transaction_id", "merchant_id"
    )
    reported = labels.join(transactions, "transaction_id").collect()
    features = _gold(spark, settings, MERCHANT_TABLE).where("merchant_chargebacks_30d > 0").collect()
    assert features, "the sample has no merchant with a reported chargeback; the test checks nothing"
    for row in features[:50]:
        t = row.event_timestamp
        known = [
            r
            for r in reported
            if r.merchant_id == row.merchant_id and t - timedelta(days=30) < r.label_timestamp <= t
        ]
        assert row.merchant_chargebacks_30d == len(known)
    later = [r for r in reported if r.label_timestamp > datetime.combine(LAST, datetime.min.time())]
    assert later  # chargebacks reported during the day exist, and each counts only from its report time on


def test_a_date_without_silver_is_refused_with_the_command_to_run(lake):
    settings, _ = lake
    with pytest.raises(PipelineError, match=r"mlops ingest --date 2026-02-01"):
        gold.build_gold(settings, date(2026, 2, 1))


def test_gold_is_versioned_with_dvc_and_fetched_back_by_revision(spark, lake):
    import filecmp

    settings, _ = lake
    first = gold.version_gold(settings, LAST)
    again = gold.version_gold(settings, LAST)
    assert first == again  # same content, same revision
    # A reproduction from the same silver is byte for byte the same gold: DVC's content hash is unchanged
    # (this is the rebuild-gives-identical-gold check; a separate row checksum of it was dropped as implied).
    gold.build_gold(settings, LAST)
    assert gold.version_gold(settings, LAST)["dataset_rev"] == first["dataset_rev"]
    remote_files = list(settings.dvc_remote.rglob("*"))
    assert any(p.name.endswith(".dir") for p in remote_files)

    from pipelines.versioning import fetch

    restored = fetch(settings, first["dataset_rev"], settings.home / "restore")
    for table, folder in restored.items():
        original = table_path(settings.lake, table) / f"event_date={LAST}"
        comparison = filecmp.dircmp(original, folder)
        assert comparison.left_list == comparison.right_list and not comparison.diff_files, table
    with pytest.raises(PipelineError, match="unknown dataset revision 'feedface'"):
        fetch(settings, "feedface", settings.home / "nowhere")
