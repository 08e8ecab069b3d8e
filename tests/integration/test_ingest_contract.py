"""The data contracts end to end on the real engines: hand-written arrivals (encodings, line endings,
quoting, numbers, offsets, ids, control characters) land typed exactly or in quarantine with a reason;
resends on a later day are duplicates, in whatever order the days are ingested; labels have a suite, a
quarantine-rate gate and a reconciliation."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest

from core.errors import DataValidationError, LandingFileError, QuarantineRateError
from core.settings import Settings
from pipelines.contracts import LABEL_COLUMNS, TRANSACTION_COLUMNS
from pipelines.ingest import job
from pipelines.lake import Tables, read_json, read_partition
from pipelines.synthetic.faults import parse_faults
from pipelines.synthetic.landing import GenerateRequest, generate_landing

DAY = date(2026, 1, 5)
NEXT = DAY + timedelta(days=1)
GOOD = {
    "transaction_id": "tx0123456789abc000",
    "customer_id": "c0000001",
    "merchant_id": "m000002",
    "amount": "12.50",
    "currency": "EUR",
    "country": "DE",
    "channel": "pos",
    "merchant_category": "grocery",
    "event_timestamp": "2026-01-05T08:00:00Z",
}


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "home", spark_driver_memory="1g", spark_shuffle_partitions=2)


def _line(n: int, **changes: str) -> str:
    row = {**GOOD, "transaction_id": f"tx0123456789abc{n:03x}", **changes}
    return ",".join(row[c] for c in TRANSACTION_COLUMNS)


# (line, what lands): a (amount, event_timestamp) bronze row, or the quarantine reason and the column named.
HAND_WRITTEN = [
    (_line(1), ("12.50", "2026-01-05 08:00:00")),
    (_line(2, amount="10.005"), ("wrong_type", "amount")),
    (_line(3, amount='"1,000.00"'), ("wrong_type", "amount")),
    (_line(4, amount=" 12.5"), ("wrong_type", "amount")),
    (_line(5, amount="1e3"), ("1000.00", "2026-01-05 08:00:00")),
    (_line(6, amount="+3"), ("3.00", "2026-01-05 08:00:00")),
    (_line(7, amount="-0"), ("out_of_range", "amount")),
    (_line(8, event_timestamp="2026-01-05T13:30:00+05:30"), ("12.50", "2026-01-05 08:00:00")),
    (_line(9, event_timestamp="2026-01-05T08:00:00.123456789Z"), ("wrong_type", "event_timestamp")),
    (_line(10, event_timestamp="2026-01-05T08:00:00.123000000Z"), ("12.50", "2026-01-05 08:00:00.123000")),
    (_line(11, transaction_id="tx12"), ("invalid_value", "transaction_id")),
    (_line(12, transaction_id="tx0123456789abc00c "), ("invalid_value", "transaction_id")),
    (_line(13, merchant_id="m00000\x07"), ("invalid_value", "merchant_id")),
    (_line(14, merchant_category='"grocery, ""fresh"""'), ("invalid_value", "merchant_category")),
    (",".join(f'"{v}"' for v in _line(15).split(",")), ("12.50", "2026-01-05 08:00:00")),
    (_line(16, customer_id="c000000\u0661"), ("invalid_value", "customer_id")),  # an Arabic-Indic digit
]


def test_a_hand_written_arrival_lands_every_line_typed_exactly_or_quarantined_by_column(spark, settings):
    """BOM, CRLF line endings, quoting: the date passes both GX gates (an off-pattern id no longer stops
    it), no value is rounded or trimmed, and every line is in exactly one of bronze and quarantine."""
    settings.ingest.max_quarantine_rate = 1.0
    folder = settings.landing / DAY.isoformat()
    folder.mkdir(parents=True)
    text = (
        "\ufeff" + "\r\n".join([",".join(TRANSACTION_COLUMNS), *(line for line, _ in HAND_WRITTEN)]) + "\r\n"
    )
    (folder / "transactions-00000.csv").write_bytes(text.encode("utf-8"))

    record = job.ingest(settings, DAY, "hand")

    assert record["status"] == "ok"
    tables = Tables(settings.lake)
    silver = {
        r.line_number: (str(r.amount), str(r.event_timestamp))
        for r in read_partition(spark, tables.silver, DAY).collect()
    }
    quarantined = {r.line_number: r for r in read_partition(spark, tables.quarantine, DAY).collect()}
    assert set(silver) | set(quarantined) == set(range(2, len(HAND_WRITTEN) + 2))
    assert not set(silver) & set(quarantined)
    for number, (line, landed) in enumerate(HAND_WRITTEN, start=2):
        if number in silver:
            assert silver[number] == landed, line
        else:
            row = quarantined.get(number)
            assert row is not None and (row.reason, row.raw_record) == (landed[0], line), line
            assert landed[1] in row.detail, row.detail
    assert record["rows_in"] == len(HAND_WRITTEN) == record["rows_bronze"] + record["rows_quarantined"]


def _land(settings: Settings, day: date, rows: int = 300) -> None:
    generate_landing(
        GenerateRequest(
            start=day, days=1, rows_per_day=rows, seed=5, landing=settings.landing, faults=parse_faults(""),
            feed_start=DAY,
        )
    )  # fmt: skip


def _resend_on_next_day(settings: Settings, line_number: int) -> str:
    """Append line `line_number` of DAY's file to NEXT's file (a producer's resend); return its id."""
    first = (settings.landing / DAY.isoformat() / "transactions-00000.csv").read_text().split("\n")
    target = settings.landing / NEXT.isoformat() / "transactions-00000.csv"
    target.write_text(target.read_text().rstrip("\n") + "\n" + first[line_number - 1] + "\n")
    return first[line_number - 1].split(",")[0]


def _silver_ids(spark, settings: Settings, day: date) -> set[str]:
    return {r.transaction_id for r in read_partition(spark, Tables(settings.lake).silver, day).collect()}


def _assert_invariants(settings: Settings, day: date) -> dict:
    record = read_json(Tables(settings.lake).reconciliation(day))
    assert record is not None
    assert record["rows_in"] == record["rows_bronze"] + record["rows_quarantined"]
    assert record["rows_silver"] + record["duplicates_removed"] == record["rows_bronze"]
    return record


def _build(settings: Settings, day: date) -> dict:
    job.ingest_to_bronze(settings, day, f"run-{day}")
    return job.build_silver(settings, day, f"run-{day}")


def test_a_resend_on_the_next_day_is_a_duplicate_naming_the_first_copys_date_and_line(spark, settings):
    _land(settings, DAY)
    _land(settings, NEXT)
    resent = _resend_on_next_day(settings, 17)
    _build(settings, DAY)
    record = _build(settings, NEXT)

    assert resent in _silver_ids(spark, settings, DAY)
    assert resent not in _silver_ids(spark, settings, NEXT)
    copies = read_partition(spark, Tables(settings.lake).quarantine, NEXT).where(
        f"stage = 'silver' AND transaction_id = '{resent}'"
    )
    (copy,) = copies.collect()
    assert copy.reason == "duplicate"
    assert copy.detail == f"transaction_id first seen in arrival {DAY} transactions-00000.csv:17"
    assert record["duplicates_removed"] == 1 and record["rebuilt_arrivals"] == []
    _assert_invariants(settings, DAY)
    _assert_invariants(settings, NEXT)


def test_ingesting_the_next_day_first_rebuilds_its_silver_when_the_first_copy_arrives(spark, settings):
    _land(settings, DAY)
    _land(settings, NEXT)
    resent = _resend_on_next_day(settings, 17)
    _build(settings, NEXT)
    assert resent in _silver_ids(spark, settings, NEXT)  # no earlier copy known yet
    before = _assert_invariants(settings, NEXT)

    record = _build(settings, DAY)

    assert record["rebuilt_arrivals"] == [NEXT.isoformat()]
    assert resent in _silver_ids(spark, settings, DAY)
    assert resent not in _silver_ids(spark, settings, NEXT)
    after = _assert_invariants(settings, NEXT)
    assert after["duplicates_removed"] == before["duplicates_removed"] + 1
    assert after["rows_silver"] == before["rows_silver"] - 1
    _assert_invariants(settings, DAY)
    # Rebuilding DAY again changes nothing more: silver of a date depends only on bronze of its lookback.
    assert _build(settings, DAY)["rebuilt_arrivals"] == []


def _labels_file(settings: Settings, lines: list[str]) -> None:
    folder = settings.landing / DAY.isoformat()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "labels-00000.csv").write_text("\n".join([",".join(LABEL_COLUMNS), *lines]) + "\n")


def test_a_labels_file_with_a_space_instead_of_t_in_its_timestamps_fails_the_task(spark, settings):
    _labels_file(settings, [f"tx0123456789abc{n:03x},1,2026-01-05 0{n}:00:00.000Z" for n in range(1, 8)])
    with pytest.raises(QuarantineRateError, match=r"labels arrival 2026-01-05: 7 of 7 rows quarantined"):
        job.ingest_labels(settings, DAY, "labels")
    tables = Tables(settings.lake)
    assert not Tables.partition(tables.silver_labels, DAY).exists()
    kept = read_partition(spark, tables.quarantine_labels, DAY).collect()
    assert {r.reason for r in kept} == {"wrong_type"} and len(kept) == 7
    assert all(r.detail.startswith("label_timestamp is not ISO 8601: 2026-01-05 0") for r in kept)


def test_labels_are_validated_by_their_suite_and_reconcile_with_duplicates_counted(spark, settings):
    lines = [f"tx0123456789abc{n:03x},1,2026-01-05T0{n}:00:00.000Z" for n in range(1, 10)]
    _labels_file(settings, [*lines, lines[0]])  # one resend within the file
    record = job.ingest_labels(settings, DAY, "labels")
    assert record["validation"]["suite"] == "silver_labels" and record["validation"]["success"]
    assert (record["rows_in"], record["rows_silver"], record["duplicates_removed"]) == (10, 9, 1)
    tables = Tables(settings.lake)
    assert read_partition(spark, tables.silver_labels, DAY).count() == 9
    assert read_partition(spark, tables.quarantine_labels, DAY).count() == 1
    assert record["quarantine_rate"] == 0


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        # Spark names lines by the URL-encoded file name: these lines vanished (then a division by zero)
        ("transactions-part 1.csv", None, "a file name Spark cannot read by"),
        ("transactions-[1].csv", None, "a file name Spark cannot read by"),  # a glob to Spark
        ("transactions-00001.csv", "\ufeff".encode(), "empty file (no rows)"),
        ("transactions-00001.csv", None, "UTF-16 text? re-export as UTF-8"),
        ("transactions-00001.json", json.dumps([GOOD]).encode(), "must be JSON Lines, one object per line"),
    ],
)
def test_a_file_unreadable_as_a_whole_stops_the_date_naming_it(settings, name, content, problem):
    folder = settings.landing / DAY.isoformat()
    folder.mkdir(parents=True)
    text = "\n".join([",".join(TRANSACTION_COLUMNS), _line(1)]) + "\n"
    (folder / "transactions-00000.csv").write_text(text.replace("abc001", "abc002"))
    data = content if content is not None else text.encode("utf-16-le" if "UTF-16" in problem else "utf-8")
    (folder / name).write_bytes(data)
    with pytest.raises(LandingFileError) as failure:
        job.ingest_to_bronze(settings, DAY, "hand")
    assert [p for p in failure.value.problems if p.startswith(name)] == [
        next(p for p in failure.value.problems if problem in p)
    ]


def test_a_line_that_is_not_utf8_past_the_first_block_is_quarantined_and_the_rest_lands(spark, settings):
    settings.ingest.max_quarantine_rate = 1.0
    folder = settings.landing / DAY.isoformat()
    folder.mkdir(parents=True)
    lines = [_line(n) for n in range(1, 300)] + [_line(300, merchant_category="caf\xe9")]
    (folder / "transactions-00000.csv").write_bytes(
        "\n".join([",".join(TRANSACTION_COLUMNS), *lines, ""]).encode("latin-1")
    )
    record = job.ingest_to_bronze(settings, DAY, "hand")
    assert (record["rows_bronze"], record["rows_quarantined"]) == (299, 1)
    (row,) = read_partition(spark, Tables(settings.lake).quarantine, DAY).collect()
    assert (row.line_number, row.reason) == (301, "malformed")
    assert row.detail.startswith("not UTF-8 text")


def test_an_arrival_whose_every_row_is_quarantined_builds_an_empty_silver_and_fails_the_gate(spark, settings):
    """It ran into a missing bronze partition; a rerun must not leave the silver of the earlier run."""
    settings.ingest.max_quarantine_rate = 1.0
    folder = settings.landing / DAY.isoformat()
    folder.mkdir(parents=True)
    target = folder / "transactions-00000.csv"
    target.write_text("\n".join([",".join(TRANSACTION_COLUMNS), _line(1)]) + "\n")
    _build(settings, DAY)
    target.write_text("\n".join([",".join(TRANSACTION_COLUMNS), _line(1, amount="x")]) + "\n")
    record = _build(settings, DAY)
    assert (record["rows_bronze"], record["rows_quarantined"], record["rows_silver"]) == (0, 1, 0)
    assert not Tables.partition(Tables(settings.lake).silver, DAY).exists()
    _assert_invariants(settings, DAY)
    with pytest.raises(DataValidationError, match="bronze_transactions"):
        job.validate_bronze(settings, DAY)


def test_a_label_whose_first_copy_is_quarantined_still_lands_and_a_copy_names_the_first(spark, settings):
    _labels_file(
        settings,
        [
            "tx0123456789abcdef,yes,2026-01-05T08:00:00Z",
            "tx0123456789abcdef,1,2026-01-05T08:00:00Z",
            "tx0123456789abcde0,1,2026-01-05T08:00:00Z",
            "tx0123456789abcde0,0,2026-01-05T09:00:00Z",
        ],
    )
    settings.ingest.max_label_quarantine_rate = 1.0
    record = job.ingest_labels(settings, DAY, "labels")
    tables = Tables(settings.lake)
    landed = {
        r.transaction_id: r.line_number for r in read_partition(spark, tables.silver_labels, DAY).collect()
    }
    assert landed == {"tx0123456789abcdef": 3, "tx0123456789abcde0": 4}
    rejected = {
        r.line_number: (r.reason, r.detail)
        for r in read_partition(spark, tables.quarantine_labels, DAY).collect()
    }
    assert rejected == {
        2: ("wrong_type", "is_fraud is not an integer: yes"),
        5: ("duplicate", "transaction_id first seen at labels-00000.csv:4"),
    }
    assert (record["rows_in"], record["rows_silver"], record["duplicates_removed"]) == (4, 2, 1)
