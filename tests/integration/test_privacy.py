"""Erasure and retention on the reference lake (tests/lake.py: quarantined, duplicated, late and re-delivered
rows), through the real engines: a customer erased (`mlops erase`'s path) is gone from landing, quarantine,
bronze, silver, the online store and, once the backfill has rebuilt gold from what is left, from every Parquet
file of the lake; Spark still reads the rewritten quarantine, ingestion reads nothing of theirs again, and the
retention DAG deletes only what is past its retention and ingested. The file formats and the lake's
partitions one by one: tests/unit/test_erase_files.py."""

from __future__ import annotations

import json
from collections import Counter
from datetime import timedelta

import pendulum
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from core import pseudonym
from core.settings import Settings, get_settings
from features import repo
from features.materialize import stored_times
from mlops.chain import erase
from pipelines.gold.contract import CUSTOMER_TABLE, gold_revision_path, table_path
from pipelines.ingest import job as ingest
from pipelines.lake import Tables
from pipelines.privacy import ERASED_FROM
from tests import lake as reference


def _landing(settings: Settings, feed: str) -> dict[str, list[dict]]:
    return {
        str(p.relative_to(settings.landing)): reference.landing_records(p)
        for p in sorted(settings.landing.glob(f"*/{feed}-*"))
    }


def _quarantined(settings: Settings, feed: str) -> list[str]:
    root = settings.lake / "quarantine" / feed
    if not root.is_dir():
        return []
    table = ds.dataset(root, partitioning="hive").to_table(columns=["raw_record"])
    return [r or "" for r in table.column("raw_record").to_pylist()]


def _holding(root, values: set[str]) -> list[str]:
    """Each `file:column` under `root` (Parquet, hidden folders too) with one of `values` in a text column."""
    import pyarrow as pa

    hits = []
    for path in sorted(root.rglob("*.parquet")):
        table = pq.read_table(path)
        for name in table.column_names:
            column = table.column(name)
            kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
            text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
            if text and values & set(column.to_pylist()):
                hits.append(f"{path.relative_to(root)}:{name}")
    return hits


def silver_customers(settings: Settings) -> list[str]:
    """Every customer pseudonym silver holds."""
    table = ds.dataset(Tables(settings.lake).silver, partitioning="hive").to_table(columns=["customer_id"])
    return table.column("customer_id").to_pylist()


@pytest.fixture
def home(tmp_path):
    return reference.reference_lake(tmp_path / "home").home


def test_an_erased_customer_is_gone_from_every_layer_and_gold_is_rebuilt_without_them(spark, home):
    settings = Settings(home=home, spark_shuffle_partitions=2)
    before = _landing(settings, "transactions")
    quarantined = _quarantined(settings, "transactions")
    labels_before = _landing(settings, "labels")
    owner = {r["transaction_id"]: r["customer_id"] for rows in before.values() for r in rows}
    reported = [r["transaction_id"] for rows in labels_before.values() for r in rows]
    chargebacks = Counter(owner[t] for t in reported if t in owner)
    # A customer with quarantined rows (every fault kind leaves some) and chargebacks, the most of both.
    counts = Counter(r.get("customer_id") for rows in before.values() for r in rows if r.get("customer_id"))
    # Bronze-stage rows keep the raw record; silver-stage ones (resent copies) hold the pseudonym.
    pseudonyms = pseudonym.for_settings(settings)
    in_quarantine = Counter(c for c in counts for raw in quarantined if c in raw)
    as_pseudonym = Counter(c for c in counts for raw in quarantined if pseudonyms.customer(c) in raw)
    customer = max(
        counts,
        key=lambda c: (in_quarantine[c] > 0 and chargebacks[c] > 0, as_pseudonym[c] > 0, in_quarantine[c]),
    )
    assert in_quarantine[customer] > 0 and chargebacks[customer] > 0, "the reference lake has such customers"
    assert as_pseudonym[customer] > 0, "and one of them has a resent copy quarantined in silver"
    theirs = {t for t, c in owner.items() if c == customer}
    their_labels = chargebacks[customer]
    # The online store (the reference lake's SQLite one, materialized) knows them and others by pseudonym.
    store = repo.open_store(settings)
    view = store.get_feature_view("customer_stats_fv")
    who = pseudonyms.customer(customer)
    candidates = sorted(set(silver_customers(settings)))
    stored = stored_times(store, view, candidates)
    known = [key for key, at in zip(candidates, stored, strict=True) if at is not None]
    assert who in known and len(known) > 1, "the customer and others have online features"
    another = next(k for k in known if k != who)
    features = [f"customer_stats_fv:{feature.name}" for feature in view.features]

    def online(entity: str) -> list:
        values = store.get_online_features(features=features, entity_rows=[{"customer_id": entity}]).to_dict()
        return [values[f.split(":")[1]][0] for f in features]

    others_before = online(another)
    assert any(v is not None for v in online(who))

    def gold_revisions() -> dict[str, str]:
        """Each gold date's newest DVC revision."""
        folder = gold_revision_path(settings.home, reference.DAYS[0]).parent
        return {p.name: json.loads(p.read_text())["dataset_rev"] for p in sorted(folder.glob("*.json"))}

    revisions_before = {p.stem for p in (settings.home / "datasets" / "revisions").glob("*.json")}
    report = erase(settings, customer)  # `mlops erase`: every layer, then gold rebuilt from what is left

    # Nothing of theirs in any Parquet file of the lake, hidden folders included (bronze, silver and its
    # labels, gold and its per-day states, the training rows, the quarantine, versions kept for readers):
    # neither their pseudonym nor their id nor one of their transactions.
    assert _holding(settings.lake, {who, customer} | theirs) == []
    assert any(name.startswith("silver/transactions/") for name in report["lake"])
    assert report["rebuilt"] and all("inputs changed" in why for why in report["rebuilt"].values())
    gold_customers = ds.dataset(table_path(settings.lake, CUSTOMER_TABLE), partitioning="hive")
    assert gold_customers.count_rows() > 0  # the others' features were rebuilt, not dropped
    # Feast's own read: nothing of theirs is served any more; another customer's features unchanged.
    assert report["online_store"] == {"customer_stats_fv": 1}
    assert online(who) == [None] * len(features) and online(another) == others_before
    assert report["rows_removed"] == sum(sum(report[k].values()) for k in ERASED_FROM)
    # The DVC remote keeps the earlier gold revisions, named: those of the dates rebuilt that held them
    # (the customer table's member), none of the rebuilt ones; no model was trained on them here.
    held = report["held_by"]
    rebuilt_now = set(gold_revisions().values())
    assert held["dataset_revisions"] and held["model_versions"] == []
    assert set(held["dataset_revisions"]) <= revisions_before - rebuilt_now
    assert all(members == [CUSTOMER_TABLE] for members in held["dataset_revisions"].values())

    after = _landing(settings, "transactions")
    for name, rows in before.items():
        kept = [r for r in rows if r.get("customer_id") != customer]
        assert after[name] == kept, name  # the others' rows unchanged, in order
    labels_after = _landing(settings, "labels")
    assert not any(r["transaction_id"] in theirs for rows in labels_after.values() for r in rows)
    assert sum(map(len, labels_before.values())) - sum(map(len, labels_after.values())) == their_labels
    gone = (customer, pseudonyms.customer(customer))
    assert not any(who in raw for raw in _quarantined(settings, "transactions") for who in gone)
    removed_lines = sum(len(before[n]) - len(after[n]) for n in before)
    assert removed_lines == counts[customer]
    assert sum(v for n, v in report["landing"].items() if "/transactions-" in n) == removed_lines
    assert sum(v for n, v in report["quarantine"].items() if "/transactions/" in n) == (
        in_quarantine[customer] + as_pseudonym[customer]
    )

    # Spark reads the rewritten quarantine (its old checksums went with the old bytes).
    tables = Tables(settings.lake)
    assert (
        spark.read.parquet(str(tables.quarantine)).count()
        == ds.dataset(tables.quarantine, partitioning="hive").count_rows()
    )
    # Ingesting an erased arrival again: bronze and silver hold nothing of the customer.
    day = reference.DAYS[0]
    record = ingest.ingest(settings, day, "after-erasure")
    assert record["status"] == "ok", record
    silver = pq.read_table(tables.silver / f"arrival_date={day}").column("customer_id").to_pylist()
    assert pseudonyms.customer(customer) not in silver and customer not in silver
    assert len(silver) == record["rows_silver"] > 0
    # the others are there, by their pseudonyms (the key came with the copy of the home)
    others = {r["customer_id"] for n, rows in after.items() if n.startswith(f"{day}/") for r in rows
              if r.get("customer_id")}  # fmt: skip
    assert set(silver) & {pseudonyms.customer(c) for c in others}


def test_the_retention_dag_deletes_what_is_old_and_ingested_and_keeps_the_rest(airflow_db, home, monkeypatch):
    from airflow.dag_processing.dagbag import DagBag
    from airflow.utils.state import DagRunState

    newest = max(reference.DAYS)
    never_ingested = home / "landing" / (reference.FIRST - timedelta(days=40)).isoformat()
    never_ingested.mkdir()
    (never_ingested / "transactions-00000.csv").write_text("transaction_id\n")
    # The scoring log by its own dates (the service's clock), whatever the lake's: 90 days back.
    scoring_log = home / "scoring_log"
    for day in ("2026-07-01", "2026-08-03", "2026-11-01"):
        (scoring_log / f"date={day}").mkdir(parents=True)
        (scoring_log / f"date={day}" / "part-0.parquet").write_bytes(b"")
    monkeypatch.setenv("MLOPS_HOME", str(home))
    monkeypatch.setenv("MLOPS_RETENTION__LANDING_DAYS", "2")
    monkeypatch.setenv("MLOPS_RETENTION__QUARANTINE_DAYS", "1")
    get_settings.cache_clear()
    settings = get_settings()
    quarantine = settings.lake / "quarantine" / "transactions"
    partitions = sorted(p.name for p in quarantine.glob("arrival_date=*"))

    dag = DagBag(dag_folder="dags").dags["enforce_retention"]
    run = dag.test(logical_date=pendulum.datetime(2026, 11, 29, tz="UTC"))  # the calendar plays no part
    assert run.state == DagRunState.SUCCESS

    landing = sorted(p.name for p in settings.landing.iterdir() if p.is_dir())
    expected = sorted(
        [never_ingested.name] + [d.isoformat() for d in reference.DAYS if d >= newest - timedelta(days=2)]
    )
    assert landing == expected
    kept = sorted(p.name for p in quarantine.glob("arrival_date=*"))
    assert kept == [p for p in partitions if p >= f"arrival_date={newest - timedelta(days=1)}"]
    assert len(kept) < len(partitions), "the reference lake quarantines rows on its early arrivals"
    assert sorted(p.name for p in scoring_log.iterdir()) == ["date=2026-08-03", "date=2026-11-01"]
