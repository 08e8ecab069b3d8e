"""Ingestion end to end on the real engines: Spark local, Parquet tables, GX suites, reconciliation."""

from __future__ import annotations

import hashlib
import json
from datetime import date

import pytest

from core.errors import EmptyArrivalError, LandingFileError, QuarantineRateError
from core.settings import Settings
from pipelines.ingest import job
from pipelines.ingest.schemas import SILVER_LABELS
from pipelines.lake import Tables, read_json, read_partition
from pipelines.synthetic.faults import parse_faults
from pipelines.synthetic.landing import GenerateRequest, generate_landing

DAY = date(2026, 1, 5)
ROW_FAULTS = "malformed=0.01,wrong_type=0.01,nulls=0.01,out_of_range=0.01,extra_column=0.01,duplicates=0.02"
EXPECTED_REASON = {
    "malformed": "malformed",
    "extra_column": "extra_column",
    "nulls": "missing_required",
    "wrong_type": "wrong_type",
    "out_of_range": "out_of_range",
}


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", spark_driver_memory="1g", spark_shuffle_partitions=2)


def _land(settings: Settings, day=DAY, rows=1500, faults="", fmt="csv", **more) -> dict:
    (manifest,) = generate_landing(
        GenerateRequest(
            start=day,
            days=1,
            rows_per_day=rows,
            seed=3,
            landing=settings.landing,
            faults=parse_faults(faults),
            fmt=fmt,
            **more,
        )
    )
    return manifest


def _silver_digest(spark, settings: Settings, day=DAY) -> tuple[int, str]:
    rows = read_partition(spark, Tables(settings.lake).silver, day).orderBy("transaction_id").collect()
    digest = hashlib.sha256(
        "\n".join(json.dumps(r.asDict(), default=str, sort_keys=True) for r in rows).encode()
    )
    return len(rows), digest.hexdigest()


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_late_and_out_of_order_deliveries_reconcile_with_every_row_fault_by_arrival(spark, settings, fmt):
    """The delivery faults on top of every row fault: dates delivered in the generator's order (each date
    after the next), rows held back a day; every arrival reconciles exactly, and each late row lands in
    silver of the arrival that carried it with its own (earlier) event date."""
    from datetime import timedelta

    settings.ingest.max_quarantine_rate = 0.2
    manifests = generate_landing(
        GenerateRequest(
            start=DAY,
            days=3,
            rows_per_day=900,
            seed=3,
            landing=settings.landing,
            faults=parse_faults(f"{ROW_FAULTS},late=0.02,out_of_order=1.0"),
            fmt=fmt,
        )
    )
    order = [m["arrival_date"] for m in manifests]
    assert order == [str(DAY + timedelta(days=1)), str(DAY), str(DAY + timedelta(days=2))]
    tables = Tables(settings.lake)
    for manifest in manifests:
        day = date.fromisoformat(manifest["arrival_date"])
        bronze = job.ingest_to_bronze(settings, day, "run-a")
        silver = job.build_silver(settings, day, "run-a")
        assert bronze["rows_in"] == manifest["transactions"]["rows_written"]
        assert bronze["rows_in"] == bronze["rows_bronze"] + bronze["rows_quarantined"]
        for fault, reason in EXPECTED_REASON.items():
            assert bronze["quarantined_by_reason"][reason] == manifest["faults"][fault], (day, reason)
        assert silver["duplicates_removed"] == manifest["faults"]["duplicates"]
        assert silver["rows_silver"] + silver["duplicates_removed"] == bronze["rows_bronze"]
        earlier = (
            read_partition(spark, tables.silver, day)
            .where(f"event_date = '{day - timedelta(days=1)}'")
            .count()
        )
        assert earlier == manifest["late_from_previous_date"], day
    by_date = {m["arrival_date"]: m for m in manifests}
    held_back = {d: by_date[d]["faults"]["late"] for d in order if d != max(order)}
    assert all(n > 0 for n in held_back.values())
    for day, n in held_back.items():  # what a date held back, the next date carried
        assert by_date[str(date.fromisoformat(day) + timedelta(days=1))]["late_from_previous_date"] == n


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_every_fault_kind_reconciles_exactly_with_the_generator_manifest(spark, settings, fmt):
    settings.ingest.max_quarantine_rate = 0.2
    manifest = _land(settings, faults=ROW_FAULTS, fmt=fmt, rows_per_file=600)
    bronze = job.ingest_to_bronze(settings, DAY, "run-a")
    silver = job.build_silver(settings, DAY, "run-a")

    assert bronze["rows_in"] == manifest["transactions"]["rows_written"]
    assert bronze["rows_in"] == bronze["rows_bronze"] + bronze["rows_quarantined"]
    for fault, reason in EXPECTED_REASON.items():
        assert bronze["quarantined_by_reason"][reason] == manifest["faults"][fault] > 0, reason
    assert bronze["quarantined_by_reason"]["invalid_value"] == 0
    assert silver["duplicates_removed"] == manifest["faults"]["duplicates"]
    assert silver["rows_silver"] == bronze["rows_bronze"] - silver["duplicates_removed"]
    assert read_json(Tables(settings.lake).reconciliation(DAY))["rows_silver"] == silver["rows_silver"]

    tables = Tables(settings.lake)
    quarantine = spark.read.parquet(str(tables.quarantine)).where(f"arrival_date = '{DAY}'")
    by_stage = {
        (r.stage, r.reason): r["count"] for r in quarantine.groupBy("stage", "reason").count().collect()
    }
    assert by_stage[("silver", "duplicate")] == manifest["faults"]["duplicates"]
    assert sum(n for (stage, _), n in by_stage.items() if stage == "bronze") == bronze["rows_quarantined"]
    ids = (
        read_partition(spark, tables.silver, DAY).groupBy("transaction_id").count().where("count > 1").count()
    )
    assert ids == 0


def test_quarantined_rows_point_at_their_exact_file_and_line_even_when_files_are_split(spark, settings):
    settings.ingest.max_quarantine_rate = 0.2
    _land(settings, rows=6000, faults=ROW_FAULTS, rows_per_file=2500)
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(64 * 1024))  # several splits per file
    try:
        job.ingest_to_bronze(settings, DAY, "run-b")
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    folder = settings.landing / DAY.isoformat()
    lines = {p.name: p.read_text().split("\n") for p in folder.glob("transactions-*.csv")}
    rows = read_partition(spark, Tables(settings.lake).quarantine, DAY).collect()
    assert len(rows) > 200
    for row in rows:
        assert lines[row.source_file][row.line_number - 1] == row.raw_record, (
            row.source_file,
            row.line_number,
        )
    bronze = (
        read_partition(spark, Tables(settings.lake).bronze, DAY)
        .select("source_file", "line_number")
        .collect()
    )
    seen = {(r.source_file, r.line_number) for r in bronze} | {(r.source_file, r.line_number) for r in rows}
    expected = {(name, n) for name, text in lines.items() for n in range(2, len(text))}
    assert seen == expected  # every data line is in exactly one of bronze and quarantine


def _bytes_read(spark) -> int:
    """Bytes this JVM has read from local files so far (Hadoop's file system statistics): the text source
    reads the landing files through it, while Spark's own disk cache does not."""
    statistics = spark._jvm.org.apache.hadoop.fs.FileSystem.getAllStatistics()
    return sum(s.getBytesRead() for s in statistics if s.getScheme() == "file")


@pytest.mark.parametrize("fmt", ["csv", "json", "csv.gz"])
def test_each_landing_file_is_read_once_and_every_line_keeps_its_exact_number(spark, settings, fmt):
    """Several files, each read in several splits (a gzipped one in one): every data line is in exactly one
    of bronze and quarantine under its own file and 1-based line number (header included), and each file's
    bytes are read once, for the numbering, the parsing and both tables together. A JSON Lines file that
    opens with a byte-order mark has its first line land as data."""
    import gzip

    settings.ingest.max_quarantine_rate = 0.2
    _land(settings, rows=9000, faults=ROW_FAULTS, fmt=fmt.removesuffix(".gz"), rows_per_file=4000)
    folder = settings.landing / DAY.isoformat()
    if fmt == "json":
        first = folder / "transactions-00000.jsonl"
        first.write_bytes("\ufeff".encode() + first.read_bytes())
    for path in folder.glob("transactions-*") if fmt.endswith(".gz") else ():
        path.with_name(f"{path.name}.gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    paths = sorted(folder.glob("transactions-*"))
    assert len(paths) == 3
    read = gzip.open if fmt.endswith(".gz") else open
    lines = {}
    for path in paths:
        with read(path, "rb") as handle:
            lines[path.name] = handle.read().decode().split("\n")[:-1]
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(160 * 1024))  # several splits per plain file
    try:
        # What reading the files once costs: each split reads on past its end to finish its last line.
        before = _bytes_read(spark)
        spark.read.text([str(p) for p in paths]).count()
        once = _bytes_read(spark) - before
        before = _bytes_read(spark)
        record = job.ingest_to_bronze(settings, DAY, "run-once")
        read_bytes = _bytes_read(spark) - before
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert sum(path.stat().st_size for path in paths) <= once <= read_bytes < 1.2 * once, (read_bytes, once)

    tables = Tables(settings.lake)
    quarantined = read_partition(spark, tables.quarantine, DAY).collect()
    for row in quarantined:
        assert lines[row.source_file][row.line_number - 1] == row.raw_record, (
            row.source_file,
            row.line_number,
        )
    bronze = read_partition(spark, tables.bronze, DAY).select("transaction_id", "source_file", "line_number")
    for row in bronze.collect():
        assert row.transaction_id in lines[row.source_file][row.line_number - 1], (
            row.source_file,
            row.line_number,
        )
    seen = [(r.source_file, r.line_number) for r in bronze.collect()] + [
        (r.source_file, r.line_number) for r in quarantined
    ]
    header = 1 if fmt.startswith("csv") else 0
    expected = {(name, n) for name, text in lines.items() for n in range(1 + header, len(text) + 1)}
    assert len(seen) == len(set(seen)) and set(seen) == expected  # once each, none left out
    assert record["rows_in"] == len(expected) and record["rows_quarantined"] == len(quarantined) > 100
    if fmt == "json":
        assert ("transactions-00000.jsonl", 1) in {(r.source_file, r.line_number) for r in bronze.collect()}


def test_rerunning_a_date_gives_identical_silver_and_replaces_only_that_date(spark, settings):
    other = date(2026, 1, 6)
    _land(settings, faults="duplicates=0.05")
    _land(settings, day=other, feed_start=DAY)
    for day in (DAY, other):
        job.ingest_to_bronze(settings, day, "first")
        job.build_silver(settings, day, "first")
    first, untouched = _silver_digest(spark, settings), _silver_digest(spark, settings, other)
    job.ingest_to_bronze(settings, DAY, "second")
    job.build_silver(settings, DAY, "second")
    assert _silver_digest(spark, settings) == first
    assert _silver_digest(spark, settings, other) == untouched
    assert first[0] > 0


def test_a_file_missing_a_column_fails_the_run_naming_file_and_column_and_writes_nothing(settings):
    manifest = _land(settings, faults="missing_column=1")
    fault = manifest["file_faults"][0]
    with pytest.raises(LandingFileError) as error:
        job.ingest_to_bronze(settings, DAY, "run-c")
    assert f"{fault['file']}: missing required column '{fault['column']}'" in str(error.value)
    tables = Tables(settings.lake)
    for root in (tables.bronze, tables.quarantine, tables.silver):
        assert not Tables.partition(root, DAY).exists()


def test_an_empty_file_beside_data_fails_but_an_empty_arrival_is_only_reported(settings):
    _land(settings, faults="empty=1")
    with pytest.raises(LandingFileError, match=r"transactions-00001\.csv: empty file"):
        job.ingest_to_bronze(settings, DAY, "run-d")
    quiet_day = date(2026, 1, 7)
    _land(settings, day=quiet_day, rows=0)
    record = job.ingest(settings, quiet_day, "run-e")
    assert record["status"] == "empty" and record["rows_in"] == 0
    settings.ingest.fail_on_empty_arrival = True
    with pytest.raises(EmptyArrivalError, match="2026-01-07 is empty"):
        job.ingest_to_bronze(settings, quiet_day, "run-f")


def test_a_quarantine_rate_above_the_limit_fails_after_keeping_the_rejected_rows(spark, settings):
    settings.ingest.max_quarantine_rate = 0.01
    manifest = _land(settings, faults="malformed=0.03")
    malformed = manifest["faults"]["malformed"]
    with pytest.raises(
        QuarantineRateError, match=rf"above the limit of 1\.00%; top reasons: malformed={malformed}\."
    ):
        job.ingest_to_bronze(settings, DAY, "run-g")
    kept = read_partition(spark, Tables(settings.lake).quarantine, DAY).count()
    assert kept == malformed > 0
    assert not Tables.partition(Tables(settings.lake).silver, DAY).exists()


def test_cli_ingest_reports_a_missing_arrival_as_one_json_line(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from mlops.cli import app

    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(app, ["ingest", "--date", "2026-03-01", "--json"])
    assert result.exit_code == 1
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "failed" and summary["error"] == "ArrivalNotFoundError"
    assert str(tmp_path / "home" / "landing" / "2026-03-01") in summary["message"]


def test_cli_runs_repeated_dates_and_steps_in_order_in_one_process_and_stops_at_the_first_failure(
    spark, settings, monkeypatch
):
    """`dvc repro` and backfills run a stage's dates and steps in one `mlops` process: each step of a date
    before the next date; the first failure ends the command naming its date and step, and what ran before
    it stays done."""
    from datetime import timedelta

    from typer.testing import CliRunner

    from mlops.cli import app

    second, missing = DAY + timedelta(days=1), DAY + timedelta(days=2)
    landed = {day: _land(settings, day=day, rows=1200, feed_start=DAY) for day in (DAY, second)}
    monkeypatch.setenv("MLOPS_HOME", str(settings.home))
    monkeypatch.setenv("MLOPS_SPARK_DRIVER_MEMORY", "1g")
    steps = ["--step", "ingest_to_bronze", "--step", "validate_bronze"]
    dates = ["--date", DAY.isoformat(), "--date", second.isoformat()]
    done = CliRunner().invoke(app, ["ingest", *dates, *steps, "--json"])
    assert done.exit_code == 0, done.output
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok"
    assert [(r["arrival_date"], r["step"]) for r in summary["runs"]] == [
        (day.isoformat(), step) for day in (DAY, second) for step in ("ingest_to_bronze", "validate_bronze")
    ]
    bronze = {r["arrival_date"]: r["rows_bronze"] for r in summary["runs"] if r["step"] == "ingest_to_bronze"}
    assert bronze == {day.isoformat(): m["transactions"]["rows_written"] for day, m in landed.items()}

    failed = CliRunner().invoke(app, ["ingest", "--date", second.isoformat(), "--date", missing.isoformat(),
                                      "--json"])  # fmt: skip
    assert failed.exit_code == 1
    failure = json.loads(failed.stdout.strip().splitlines()[-1])
    assert (failure["status"], failure["arrival_date"], failure["step"]) == ("failed", missing.isoformat(),
                                                                            "ingest")  # fmt: skip
    assert failure["error"] == "ArrivalNotFoundError"
    assert Tables.partition(Tables(settings.lake).silver, second).is_dir()  # the date before it stays done


def test_chargebacks_land_in_silver_labels_and_broken_ones_in_quarantine(spark, settings):
    from datetime import timedelta

    settings.ingest.max_label_quarantine_rate = 0.5  # two broken lines among a dozen, on purpose
    for offset in range(4):
        _land(settings, day=DAY + timedelta(days=offset), rows=2000, feed_start=DAY)
    last = DAY + timedelta(days=3)
    labels_file = settings.landing / last.isoformat() / "labels-00000.csv"
    good = labels_file.read_text().splitlines()
    assert len(good) > 3, "the generator should have reported chargebacks by the fourth day"
    broken = ["garbage", good[1].replace(",1,", ",2,"), good[1]]  # malformed, out of range, duplicate
    labels_file.write_text("\n".join(good + broken) + "\n")

    records = [job.ingest_labels(settings, DAY + timedelta(days=o), "run-l") for o in range(4)]
    last_record = records[-1]
    assert last_record["rows_in"] == len(good) - 1 + len(broken)
    assert last_record["quarantined_by_reason"] == {"malformed": 1, "out_of_range": 1}
    assert last_record["duplicates_removed"] == 1
    assert last_record["rows_silver"] == len(good) - 1
    tables = Tables(settings.lake)
    quarantined = {r.reason for r in read_partition(spark, tables.quarantine_labels, last).collect()}
    assert quarantined == {"malformed", "out_of_range", "duplicate"}

    for offset in range(4):
        day = DAY + timedelta(days=offset)
        job.ingest_to_bronze(settings, day, "run-t")
        job.build_silver(settings, day, "run-t")
    transactions = spark.read.parquet(str(tables.silver)).select("transaction_id", "event_timestamp")
    labels = spark.read.parquet(str(tables.silver_labels))
    # the schema its readers give Spark (gold's per-day states) is what ingest_labels writes
    assert [(f.name, f.dataType) for f in labels.schema] == [(f.name, f.dataType) for f in SILVER_LABELS]
    joined = labels.join(transactions, "transaction_id", "left")
    assert (
        joined.where("event_timestamp IS NULL").count() == 0
    )  # every chargeback refers to a landed transaction
    assert joined.where("label_timestamp <= event_timestamp").count() == 0
    assert labels.count() == sum(r["rows_silver"] for r in records) > 0


def _silver_values(spark, settings: Settings) -> list[tuple]:
    """Silver's rows as the producer sent them (not where they came from: file names, line numbers of a
    file that changed name, run ids)."""
    table = read_partition(spark, Tables(settings.lake).silver, DAY)
    rows = table.select("transaction_id", "customer_id", "merchant_id", "amount", "currency",
                        "country", "channel", "merchant_category", "event_timestamp")  # fmt: skip
    return sorted(tuple(r) for r in rows.collect())


def _redeliver(folder, rename) -> None:
    """Re-deliver every data file of an arrival under another name (and encoding): what a producer does."""
    import gzip
    import shutil

    for path in sorted(folder.glob("*-*.*")):
        target = folder / rename(path.name)
        if target.name.lower().endswith(".gz"):
            with path.open("rb") as source, gzip.open(target, "wb") as sink:
                shutil.copyfileobj(source, sink)
        else:
            shutil.copyfile(path, target)
        path.unlink()


@pytest.mark.parametrize(
    ("fmt", "rename"),
    [
        ("csv", lambda name: f"{name}.gz"),
        ("json", lambda name: f"{name}.gz"),
        ("csv", lambda name: name.replace(".csv", ".CSV")),
    ],
    ids=["csv.gz", "jsonl.gz", "upper-case suffix"],
)
def test_a_gzipped_or_renamed_redelivery_gives_the_same_silver_and_labels(spark, settings, fmt, rename):
    _land(settings, faults=ROW_FAULTS, fmt=fmt)
    job.ingest(settings, DAY, "plain")
    plain, labels = _silver_values(spark, settings), job.ingest_labels(settings, DAY, "plain")
    _redeliver(settings.landing / DAY.isoformat(), rename)
    record = job.ingest(settings, DAY, "redelivered")
    assert record["status"] == "ok"
    assert _silver_values(spark, settings) == plain and len(plain) > 0
    again = job.ingest_labels(settings, DAY, "redelivered")
    counts = ("rows_in", "rows_silver", "rows_quarantined")
    assert [again[k] for k in counts] == [labels[k] for k in counts]
    assert again["files"] != labels["files"]  # the re-delivered labels file was the one read


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("transactions-00000.parquet", b"PAR1", "in no format ingestion reads"),
        ("transactions-00000.csv.gz", b"not gzip at all", "not a readable gzip file"),
        ("transactions-00000.csv.GZ", b"", "must end in lower-case .gz"),
    ],
)
def test_a_data_file_that_cannot_be_read_stops_the_date_and_keeps_what_was_there(
    spark, settings, name, content, problem
):
    _land(settings)
    job.ingest(settings, DAY, "first")
    before = _silver_digest(spark, settings)
    folder = settings.landing / DAY.isoformat()
    for path in folder.glob("transactions-*"):
        path.unlink()
    (folder / name).write_bytes(content)
    with pytest.raises(LandingFileError, match=f"{name}: .*{problem}"):
        job.ingest_to_bronze(settings, DAY, "second")
    assert _silver_digest(spark, settings) == before  # not read as an empty arrival that clears the date
