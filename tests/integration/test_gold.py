"""Gold features from silver on the real engines: point-in-time correctness against a brute-force
recomputation, no label leakage, the gold GX suites, and identical gold on rerun."""

from __future__ import annotations

import math
from datetime import date, datetime, timedelta

import pytest

from core.errors import PipelineError
from core.settings import Settings
from pipelines.contracts import CURRENCY_PER_USD, HOME_COUNTRIES
from pipelines.gold import job as gold
from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, WINDOWS, features_of, table_path
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


_EPOCH = datetime(1970, 1, 1)
_MS = timedelta(milliseconds=1)


def _ms(when: datetime) -> int:
    return (when.replace(tzinfo=None) - _EPOCH) // _MS


def _input_values(rows: list, feature) -> list:
    """The feature's input of each silver row, by the declaration's definition (contract.INPUTS)."""
    if feature.input == "amount_usd":
        return [float(r.amount) / CURRENCY_PER_USD[r.currency] for r in rows]
    if feature.input == "is_foreign":
        return [0.0 if HOME_COUNTRIES.get(r.country) == r.currency else 1.0 for r in rows]
    if feature.input == "merchant_id":
        return [r.merchant_id for r in rows]
    return [1] * len(rows)


def _oracle(feature, row, history: list, reports: list):
    """A declared feature recomputed from silver by brute force: every row of the entity in (t - w, t], in
    whole milliseconds, aggregated as the declaration says."""
    t = _ms(row.event_timestamp)
    if feature.aggregation == "time_since_previous":
        earlier = [_ms(h.event_timestamp) for h in history if _ms(h.event_timestamp) < t]
        return (t - max(earlier)) / 1000.0 if earlier else None
    width = WINDOWS[feature.window] * 1000
    inside = [h for h in history if t - width < _ms(h.event_timestamp) <= t]
    if feature.input == "chargeback":
        reported = sum(1 for r in reports if t - width < _ms(r.label_timestamp) <= t)
        return reported if feature.aggregation == "count" else reported / len(inside)
    values = _input_values(inside, feature)
    n = len(values)
    aggregation = feature.aggregation
    if aggregation == "count":
        return n
    if aggregation == "distinct_count":
        return len(set(values))
    if aggregation == "max":
        return max(values)
    if aggregation == "sum":
        return sum(values)
    mean = sum(values) / n
    if aggregation in ("mean", "share", "per_transaction"):
        return mean
    assert aggregation == "std", aggregation
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None


@pytest.mark.parametrize("entity", ["customer", "merchant"])
def test_every_declared_feature_equals_a_brute_force_point_in_time_recomputation(spark, lake, entity):
    """Each declared feature of a sample of gold rows against the oracle generated from the same declaration
    (its input, aggregation and window), recomputed from silver row by row: what gold's incremental Spark
    (sliding frames, per-day states and running sums) must equal."""
    settings, _ = lake
    key = f"{entity}_id"
    table = CUSTOMER_TABLE if entity == "customer" else MERCHANT_TABLE
    silver = spark.read.parquet(str(settings.lake / "silver" / "transactions")).collect()
    labels = spark.read.parquet(str(settings.lake / "silver" / "labels")).where("is_fraud = 1")
    merchants = spark.read.parquet(str(settings.lake / "silver" / "transactions")).select(
        "transaction_id", "merchant_id"
    )
    reported: dict[str, list] = {}
    for r in labels.join(merchants, "transaction_id").collect():
        reported.setdefault(r.merchant_id, []).append(r)
    history: dict[str, list] = {}
    for r in silver:
        history.setdefault(r[key], []).append(r)
    rows = _gold(spark, settings, table).orderBy(key, "event_timestamp").collect()
    declared = features_of(entity)
    checked = 0
    for row in rows[:: 37 if entity == "customer" else 29]:  # a deterministic sample
        for feature in declared:
            expected = _oracle(feature, row, history[row[key]], reported.get(row[key], []))
            got = row[feature.name]
            where = (row[key], row.event_timestamp, feature.name)
            if expected is None or feature.dtype == "int64":
                assert got == expected, where
            else:
                # from sums (whole-day windows) a deviation carries the sums' rounding
                rel = 1e-6 if feature.aggregation == "std" else 1e-9
                assert got == pytest.approx(expected, rel=rel, abs=1e-9), where
            checked += 1
        assert row.created_timestamp == datetime(LAST.year, LAST.month, LAST.day) + timedelta(days=1)
    assert checked >= 20 * len(declared), f"only {checked} values checked"


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
