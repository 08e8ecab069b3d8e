"""What an arrival folder may hold, and what an arrival that lost its files may do to the lake: real Spark,
Parquet tables and the synthetic generator's folders."""

from __future__ import annotations

import hashlib
from datetime import date, timedelta

import pytest

from core.errors import LandingFileError
from core.settings import Settings
from pipelines.ingest import job
from pipelines.ingest.landing import LostArrivalError
from pipelines.lake import Tables, read_json
from pipelines.synthetic.landing import GenerateRequest, ProducerFolderError, generate_landing

DAY = date(2026, 1, 5)


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", spark_driver_memory="1g", spark_shuffle_partitions=2)


def _land(settings: Settings, day=DAY, days=1, rows=600, feed_start=None) -> list[dict]:
    request = GenerateRequest(
        start=day, days=days, rows_per_day=rows, seed=3, landing=settings.landing, feed_start=feed_start
    )
    return generate_landing(request)


def _counts(spark, *partitions) -> list[int]:
    return [spark.read.parquet(str(p)).count() if p.is_dir() else 0 for p in partitions]


def _digests(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _make_entry(folder, name: str) -> None:
    if name.endswith("/"):
        (folder / name.rstrip("/")).mkdir()
        (folder / name.rstrip("/") / "transactions-00000.csv").write_text("copy\n")
    else:
        (folder / name).write_text("a,b\n1,2\n")


@pytest.mark.parametrize("name", ["notes.txt", "transactions.csv", "extra/", "labels-00000.txt"])
def test_an_unexpected_entry_fails_the_date_naming_it_unless_an_ignore_pattern_matches(settings, name):
    _land(settings)
    folder = settings.landing / DAY.isoformat()
    _make_entry(folder, name)
    entry = name.rstrip("/")
    tables = Tables(settings.lake)
    with pytest.raises(LandingFileError, match=rf"\n  - {entry}: a (file|folder) ") as error:
        job.ingest_to_bronze(settings, DAY, "strict")
    assert "nothing was written" in str(error.value)
    assert not Tables.partition(tables.bronze, DAY).exists()
    assert not tables.reconciliation(DAY).exists()
    if not entry.startswith("labels-"):  # named as data, a labels-* file can only be fixed, not ignored
        assert f'MLOPS_INGEST__IGNORE_FILES=\'[".*", "_*", "{entry}"]\'' in str(error.value)
        with pytest.raises(LandingFileError, match=rf"\n  - {entry}: "):
            job.ingest_labels(settings, DAY, "strict")
        settings.ingest.ignore_files = [*settings.ingest.ignore_files, entry]
        record = job.ingest_to_bronze(settings, DAY, "ignoring")
        assert record["status"] == "bronze" and record["rows_in"] > 0


def test_the_synthetic_generators_own_files_are_accepted_with_no_ignore_pattern(settings):
    _land(settings)
    folder = settings.landing / DAY.isoformat()
    assert {"_GENERATED_BY", "_SUCCESS", "_manifest.json"} <= {p.name for p in folder.iterdir()}
    settings.ingest.ignore_files = []
    assert job.ingest_to_bronze(settings, DAY, "strict")["status"] == "bronze"
    (folder / ".DS_Store").write_bytes(b"\0")
    with pytest.raises(LandingFileError, match=r"\.DS_Store: a file that is neither a data file"):
        job.ingest_to_bronze(settings, DAY, "strict")


def test_an_arrival_whose_files_vanished_keeps_the_lake_unless_overridden(spark, settings):
    _land(settings)
    job.ingest(settings, DAY, "first")
    tables = Tables(settings.lake)
    partitions = [Tables.partition(root, DAY) for root in (tables.bronze, tables.silver, tables.quarantine)]
    before, record = _counts(spark, *partitions), read_json(tables.reconciliation(DAY))
    assert before[0] > 0 and before[1] > 0
    folder = settings.landing / DAY.isoformat()
    for path in folder.glob("transactions-*"):
        path.unlink()

    with pytest.raises(LostArrivalError) as error:
        job.ingest_to_bronze(settings, DAY, "lost")
    message = str(error.value)
    assert f"bronze {before[0]} rows, silver {before[1]} rows" in message
    assert "ingested by run first from transactions-00000.csv" in message
    assert "restore them" in message and "MLOPS_INGEST__ALLOW_EMPTY_OVERWRITE=true" in message
    assert _counts(spark, *partitions) == before
    assert read_json(tables.reconciliation(DAY)) == record

    settings.ingest.allow_empty_overwrite = True
    cleared = job.ingest_to_bronze(settings, DAY, "retracted")
    assert cleared["status"] == "empty" and cleared["rows_in"] == 0
    assert cleared["cleared_rows"]["bronze"] == before[0]
    assert not any(p.exists() for p in partitions)
    assert read_json(tables.reconciliation(DAY)) == cleared
    settings.ingest.allow_empty_overwrite = False  # the lake now holds nothing of the date to lose
    assert job.ingest_to_bronze(settings, DAY, "again")["status"] == "empty"


def test_a_labels_arrival_whose_file_vanished_keeps_silver_labels_unless_overridden(spark, settings):
    last = DAY + timedelta(days=3)
    _land(settings, days=4, rows=2000, feed_start=DAY)
    first = job.ingest_labels(settings, last, "first")
    assert first["rows_silver"] > 0, "the generator should have reported chargebacks by the fourth day"
    tables = Tables(settings.lake)
    silver = Tables.partition(tables.silver_labels, last)
    (settings.landing / last.isoformat() / "labels-00000.csv").unlink()

    with pytest.raises(LostArrivalError, match=rf"no labels data rows .* silver {first['rows_silver']} rows"):
        job.ingest_labels(settings, last, "lost")
    assert _counts(spark, silver) == [first["rows_silver"]]
    assert read_json(tables.labels_reconciliation(last)) == first

    settings.ingest.allow_empty_overwrite = True
    cleared = job.ingest_labels(settings, last, "retracted")
    assert cleared["rows_in"] == 0 and cleared["cleared_rows"]["silver"] == first["rows_silver"]
    assert not silver.exists()


def test_synthetic_landing_never_writes_into_a_producers_folder(settings):
    producer = settings.landing / DAY.isoformat()
    producer.mkdir(parents=True)
    (producer / "transactions-00000.csv").write_text("transaction_id\nt-1\n")
    (producer / "_SUCCESS").touch()
    before = _digests(producer)

    with pytest.raises(ProducerFolderError, match=rf"{producer} holds files .*transactions-00000\.csv"):
        _land(settings, day=DAY - timedelta(days=1), days=2)
    assert _digests(producer) == before
    day_before = (DAY - timedelta(days=1)).isoformat()  # generated first; no staging folder left behind
    assert sorted(p.name for p in settings.landing.iterdir()) == [day_before, DAY.isoformat()]


def test_rerunning_synthetic_landing_rewrites_its_own_folder_identically(settings):
    _land(settings)
    folder = settings.landing / DAY.isoformat()
    first = _digests(folder)
    assert "_GENERATED_BY" in first
    (folder / "transactions-00000.csv").write_text("edited\n")
    _land(settings)
    assert _digests(folder) == first
