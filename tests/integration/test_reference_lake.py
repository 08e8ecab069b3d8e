"""The reference lake (tests/lake.py) is safe to share: a copy hard-links the cache's Parquet files, and
every writer of the pipeline run on the copy (ingestion, a re-delivery, the features stage with its gold,
DVC version and online store, the retrain's training set) leaves the cache byte for byte and mode for mode as
it was. The lake holds what it promises: every fault kind, reconciled, with gold a rebuild from scratch."""

from __future__ import annotations

import itertools
import json
from datetime import date, timedelta

from core.settings import Settings
from mlops import chain
from pipelines.ingest import job as ingest
from pipelines.lake import Tables, read_json
from pipelines.synthetic.landing import GenerateRequest, generate_landing
from tests import lake as reference
from tests.integration.gold_checks import (
    assert_gold_is_a_rebuild_from_scratch,
    assert_online_holds_latest_gold,
    counts_by_event_date,
    gold_tables,
    silver_by_event_date,
)


def test_writers_on_a_copy_leave_the_cached_lake_unchanged(spark, tmp_path, monkeypatch):
    source, _ = reference.cached_lake()
    before = reference.snapshot(source)
    phases = reference.snapshot(reference.phases_of(source))  # share the home's untouched Parquet files
    copy = reference.reference_lake(tmp_path / "home")
    settings = Settings(home=copy.home)
    linked = [
        p
        for p in copy.home.rglob("*.parquet")
        if p.stat().st_ino == (source / p.relative_to(copy.home)).stat().st_ino
    ]
    assert linked, "a copy must share the cache's Parquet files, not copy them"

    # A new arrival, a re-delivery of a cached date and the features stage over both.
    nxt = reference.DAYS[-1] + timedelta(days=1)
    generate_landing(
        GenerateRequest(
            start=nxt, days=1, rows_per_day=reference.SPEC["rows_per_day"], seed=8, landing=settings.landing,
            customers=150, merchants=40, feed_start=reference.FIRST,
        )
    )  # fmt: skip
    ingest.ingest(settings, nxt, "copy:next")
    chain.features(settings, nxt)
    data = sorted((settings.landing / reference.FIRST.isoformat()).glob("transactions-*"))[-1]
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:-10]))
    ingest.ingest(settings, reference.FIRST, "copy:redelivered")
    record = chain.features(settings, reference.FIRST)
    assert record["plan"]["event_dates"][-1] == nxt.isoformat()
    # The retrain's training set, versioned with DVC.
    from training.dataset import write_training_set

    monkeypatch.setenv("MLOPS_HOME", str(copy.home))
    write_training_set(Settings(home=copy.home), nxt)

    assert reference.snapshot(source) == before, "a writer changed a file of the cached lake in place"
    assert reference.snapshot(reference.phases_of(source)) == phases
    still_linked = [p for p in linked if p.exists() and p.stat().st_nlink > 1]
    assert still_linked, "the untouched dates' files stay shared"


def test_a_lake_is_current_while_the_files_its_build_read_are_unchanged(monkeypatch, tmp_path):
    """find_cached against a lake recorded as built from two files: kept while they and the parameters
    hold, stale (None: rebuilt) when a file it read changes or goes, or a parameter changes; a file it did
    not read changes nothing."""
    code, root = tmp_path / "repo", tmp_path / "cache"
    (code / "pipelines").mkdir(parents=True)
    root.mkdir()
    for name in ("read.py", "other.py"):
        (code / "pipelines" / name).write_text("A = 1\n")
    monkeypatch.setattr(reference, "REPO", code)
    files = ["pipelines/read.py", "params.yaml"]
    (code / "params.yaml").write_text("seed: 5\n")
    done = root / f"lake-{reference.code_key(files)}"
    done.mkdir()
    (done / reference.EVENTS_FILE).write_text("{}")
    (root / f"{done.name}.inputs.json").write_text(json.dumps({"files": files}))

    assert reference.find_cached(root) == done
    (code / "pipelines" / "other.py").write_text("A = 2\n")
    assert reference.find_cached(root) == done, "a file the build did not read keeps the lake"
    (code / "pipelines" / "read.py").write_text("A = 2\n")
    assert reference.find_cached(root) is None
    (code / "pipelines" / "read.py").write_text("A = 1\n")
    assert reference.find_cached(root) == done
    monkeypatch.setitem(reference.SPEC, "rows_per_day", reference.SPEC["rows_per_day"] + 1)
    assert reference.find_cached(root) is None
    monkeypatch.setitem(reference.SPEC, "rows_per_day", reference.SPEC["rows_per_day"] - 1)
    (code / "params.yaml").unlink()
    assert reference.find_cached(root) is None


def test_the_build_records_the_product_code_it_read_and_not_the_rest(tmp_path):
    """The cached lake's recorded inputs: the ingestion, gold and suite files it ran, never the scoring
    service, the DAGs or another test module."""
    done, _ = reference.cached_lake()
    files = json.loads((done.with_name(f"{done.name}.inputs.json")).read_text())["files"]
    for needed in (
        "pipelines/ingest/job.py",
        "pipelines/gold/transforms.py",
        "pipelines/expectations/silver_transactions.json",
        "core/settings.py",
    ):
        assert needed in files
    assert not [f for f in files if f.startswith(("serving/", "dags/", "docs/", "tests/integration/"))], files


def test_the_reference_lake_holds_every_fault_kind_reconciled(spark, tmp_path):
    copy = reference.reference_lake(tmp_path / "home")
    settings = Settings(home=copy.home)
    events = copy.events
    delivered = [date.fromisoformat(d) for d in events["delivered"]]
    assert sorted(delivered) == reference.DAYS
    assert delivered != sorted(delivered), "a date is delivered after the next one"
    assert events["late_rows"] > 0 and events["duplicate_rows"] > 0 and events["quarantined_rows"] > 0
    # The date delivered after the next one rebuilt that next date.
    came_late = next(after for day, after in itertools.pairwise(delivered) if after < day)
    assert (came_late + timedelta(days=1)).isoformat() in events["built"][came_late.isoformat()]
    assert reference.UNLABELLED.isoformat() in events["labels_rebuilt"]
    assert events["redelivery_rebuilt"][-1] == reference.DAYS[-1].isoformat()
    tables = Tables(settings.lake)
    for day in reference.DAYS:
        record = read_json(tables.reconciliation(day))
        assert record is not None, day
        assert record["rows_in"] == record["rows_bronze"] + record["rows_quarantined"], record
        assert record["rows_silver"] + record["duplicates_removed"] == record["rows_bronze"], record
    assert (
        sum(read_json(tables.reconciliation(d))["rows_quarantined"] for d in reference.DAYS)
        >= events["quarantined_rows"]
    )
    silver = silver_by_event_date(settings)
    assert counts_by_event_date(gold_tables(settings)[0]) == silver
    assert counts_by_event_date(gold_tables(settings)[1]) == silver
    assert_gold_is_a_rebuild_from_scratch(settings, tmp_path)
    assert_online_holds_latest_gold(settings)


def test_a_copy_is_its_own_a_removed_file_stays_in_the_cache(tmp_path):
    source, _ = reference.cached_lake()
    copy = reference.reference_lake(tmp_path / "home")
    victim = next(copy.home.rglob("*.parquet"))
    victim.unlink()
    assert (source / victim.relative_to(copy.home)).is_file()
    landing = next((copy.home / "landing").rglob("transactions-*"))
    landing.write_text("rewritten")
    assert (source / landing.relative_to(copy.home)).read_text() != "rewritten"
