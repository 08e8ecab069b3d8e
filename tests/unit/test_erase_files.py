"""`mlops erase --customer` on the files themselves: CSV and JSON lines, gzipped or not, lines that parse and
lines that do not, the chargebacks of the customer's transactions, and the quarantine's Parquet files with
the older versions a write kept. The reference lake's run through Spark is in
tests/integration/test_privacy.py."""

from __future__ import annotations

import gzip
import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core import pseudonym
from core.settings import Settings
from pipelines.privacy import ErasureError, erase_customer
from tests.conftest import free_port

WHO = "c0000042"
HEADER = "event_timestamp,customer_id,transaction_id,merchant_id,amount,currency\n"


def _csv_rows() -> list[str]:
    return [
        f"2026-01-01T10:00:00Z,{WHO},tx00000000000000a1,m000001,10.00,USD\n",
        "2026-01-01T10:01:00Z,c00000421,tx00000000000000b1,m000001,11.00,USD\n",  # a longer id: not theirs
        f"2026-01-01T10:02:00Z,{WHO},tx00000000000000a2,m000002,12.00,USD\n",
        f"2026-01-01T10:03:00Z,{WHO},broken\n",  # does not parse: theirs by the token
        "2026-01-01T10:04:00Z,c0000007,broken\n",  # does not parse, not theirs
        '"2026-01-01T10:05:00Z","c0000007","tx00000000000000b2","m000003","9.50","EUR"\n',
    ]


def _json_rows() -> list[str]:
    return [
        json.dumps({"customer_id": WHO, "transaction_id": "tx00000000000000a3", "amount": "5.00"}) + "\n",
        # Parses, and the customer field decides: another customer's record that mentions the id elsewhere.
        json.dumps({"customer_id": "c0000007", "transaction_id": "tx00000000000000b3", "note": WHO}) + "\n",
        '{"customer_id": "' + WHO + '", "amount": \n',  # broken JSON holding the id
    ]


@pytest.fixture
def settings(tmp_path):
    settings = Settings(home=tmp_path / "home")
    first, second = settings.landing / "2026-01-01", settings.landing / "2026-01-02"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "transactions-00000.csv").write_text(HEADER + "".join(_csv_rows()))
    with gzip.open(second / "transactions-00000.jsonl.gz", "wt") as packed:
        packed.write("".join(_json_rows()))
    (second / "transactions-00001.csv").write_text(HEADER + _csv_rows()[1])  # nothing of theirs
    (second / "labels-00000.csv").write_text(
        "transaction_id,is_fraud,label_timestamp\n"
        "tx00000000000000a1,1,2026-01-02T09:00:00Z\n"
        "tx00000000000000b1,1,2026-01-02T09:00:00Z\n"
        "tx00000000000000a3,1,2026-01-02T09:00:00Z\n"
    )
    (second / "_SUCCESS").touch()
    return settings


def _quarantine(settings: Settings, feed: str, rows: dict[str, list]) -> tuple:
    partition = settings.lake / "quarantine" / feed / "arrival_date=2026-01-02" / "stage=ingest"
    partition.mkdir(parents=True)
    path = partition / "part-00000-x.parquet"
    pq.write_table(pa.table(rows), path)
    crc = partition / ".part-00000-x.parquet.crc"
    crc.write_bytes(b"spark's checksum of the old bytes")
    retired = settings.lake / "quarantine" / feed / ".staging" / "retired-1-old" / "removed"
    retired.mkdir(parents=True)
    (retired / "part-old.parquet").write_bytes(path.read_bytes())
    return path, crc, retired.parent


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_customers_lines_go_from_every_format_and_the_rest_stay_as_they_were(settings):
    untouched = settings.landing / "2026-01-02" / "transactions-00001.csv"
    before = _digest(untouched)
    report = erase_customer(settings, WHO)

    rows = _csv_rows()
    assert (settings.landing / "2026-01-01" / "transactions-00000.csv").read_text() == HEADER + "".join(
        [rows[1], rows[4], rows[5]]
    )
    with gzip.open(settings.landing / "2026-01-02" / "transactions-00000.jsonl.gz", "rt") as packed:
        assert packed.read() == _json_rows()[1]
    # Their chargebacks go with their transactions (a1 from the CSV, a3 from the JSON); b1 is not theirs.
    assert (settings.landing / "2026-01-02" / "labels-00000.csv").read_text() == (
        "transaction_id,is_fraud,label_timestamp\ntx00000000000000b1,1,2026-01-02T09:00:00Z\n"
    )
    assert _digest(untouched) == before
    assert report["landing"] == {
        "2026-01-01/transactions-00000.csv": 3,
        "2026-01-02/transactions-00000.jsonl.gz": 2,
        "2026-01-02/labels-00000.csv": 2,
    }
    assert report["rows_removed"] == 7 and report["failed"] == {}
    assert report["lake"] == {} and report["scoring_log"] == {}  # no lake here, and no service has logged
    assert any("MLflow" in store for store in report["not_reached"])
    # what those stores hold instead of the id, for the operator to look for
    assert report["pseudonym"] == pseudonym.for_settings(settings).customer(WHO)
    assert not list(settings.landing.rglob(".erasing-*"))

    again = erase_customer(settings, WHO)
    assert again["rows_removed"] == 0 and again["landing"] == {}


def test_the_quarantine_loses_their_rows_and_every_older_copy(settings):
    path, crc, retired = _quarantine(
        settings,
        "transactions",
        {
            "raw_record": [f"x,{WHO},broken", "x,c0000007,broken", json.dumps({"customer_id": WHO}), None],
            "transaction_id": ["tx1", "tx2", "tx3", "tx4"],
        },
    )
    labels_path, _, _ = _quarantine(
        settings,
        "labels",
        {
            "raw_record": ["tx00000000000000a1,2,late", "tx00000000000000b1,2,late"],
            "transaction_id": ["tx00000000000000a1", "tx00000000000000b1"],
        },
    )
    report = erase_customer(settings, WHO)
    assert pq.read_table(path).column("transaction_id").to_pylist() == ["tx2", "tx4"]
    assert pq.read_table(labels_path).column("transaction_id").to_pylist() == ["tx00000000000000b1"]
    assert not crc.exists() and not retired.exists()
    assert report["quarantine"] == {
        "quarantine/transactions/arrival_date=2026-01-02/stage=ingest/part-00000-x.parquet": 2,
        "quarantine/labels/arrival_date=2026-01-02/stage=ingest/part-00000-x.parquet": 1,
    }


def test_a_file_that_cannot_be_read_is_named_and_the_others_are_still_erased(settings):
    broken = settings.landing / "2026-01-01" / "transactions-00009.csv.gz"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ErasureError, match=r"2026-01-01/transactions-00009\.csv\.gz") as raised:
        erase_customer(settings, WHO)
    assert "run `mlops erase` again" in str(raised.value)
    assert f",{WHO}," not in (settings.landing / "2026-01-01" / "transactions-00000.csv").read_text()


@pytest.mark.parametrize("bad", ["", "  ", "c00*", "c000 0042", "../c0000042"])
def test_an_id_that_is_not_an_id_is_refused(settings, bad):
    with pytest.raises(ValueError, match="is not a customer id"):
        erase_customer(settings, bad)


def test_the_customers_rows_leave_every_file_of_the_scoring_log_and_the_others_stay(settings):
    """The scoring service logs pseudonyms (serving/scoring_log.py): the customer's rows go from each file
    that has them, on every scoring date; a file without them is not rewritten; another customer's stay."""
    from datetime import UTC, date, datetime

    from serving.scoring_log import ScoringLog, read_scoring_log
    from tests.integration.test_scoring_log import row

    theirs = pseudonym.for_settings(settings).customer(WHO)
    other = pseudonym.for_settings(settings).customer("c0000007")
    log = ScoringLog(settings.scoring_log_dir)
    rows = []
    for n, (who, day) in enumerate([(theirs, 10), (other, 10), (theirs, 11), (other, 11), (other, 12)]):
        at = datetime(2026, 3, day, 12, tzinfo=UTC)
        rows.append({**row(n, at, at), "customer_id": who})
    for one in rows:  # a file each
        log.append([one])
        log.flush()
    log.close()
    untouched = sorted(settings.scoring_log_dir.glob("date=2026-03-12/*.parquet"))
    before = [path.read_bytes() for path in untouched]

    report = erase_customer(settings, WHO)

    assert sorted(report["scoring_log"].values()) == [1, 1]
    assert all(name.startswith("scoring_log/date=2026-03-1") for name in report["scoring_log"])
    assert report["rows_removed"] == 7 + 2  # the landing's and quarantine's as before, and the log's
    kept = read_scoring_log(settings.scoring_log_dir, date(2026, 3, 9), date(2026, 3, 13))
    assert sorted(kept["customer_id"].to_pylist()) == [other] * 3
    assert [path.read_bytes() for path in untouched] == before
    assert not list(settings.scoring_log_dir.rglob(".erasing-*"))


def test_bronze_silver_and_the_labels_lose_their_rows_partition_by_partition_with_no_older_copy(settings):
    """The lake past landing knows the customer by pseudonym: their rows leave bronze and silver, their
    transactions' chargebacks leave silver's labels; a partition with none of theirs keeps its bytes, one with
    only theirs is removed, and the versions earlier writes kept for readers go too."""
    theirs = pseudonym.for_settings(settings).customer(WHO)
    lake = settings.lake
    # tx..a1 is theirs in landing (its chargeback is found there); tx..a9 only in silver (found by pseudonym)
    silver = {
        "2026-01-01": {"transaction_id": ["tx00000000000000a9", "tx00000000000000b9"],
                       "customer_id": [theirs, "p-other"]},
        "2026-01-02": {"transaction_id": ["tx00000000000000b8"], "customer_id": ["p-other"]},
        "2026-01-03": {"transaction_id": ["tx00000000000000a8"], "customer_id": [theirs]},
    }  # fmt: skip
    for table in ("bronze", "silver"):
        for day, rows in silver.items():
            partition = lake / table / "transactions" / f"arrival_date={day}"
            partition.mkdir(parents=True)
            pq.write_table(pa.table(rows), partition / "part-00000-s.parquet")
    labels = lake / "silver" / "labels" / "arrival_date=2026-01-02"
    labels.mkdir(parents=True)
    pq.write_table(
        pa.table({"transaction_id": ["tx00000000000000a9", "tx00000000000000a1", "tx00000000000000b8"]}),
        labels / "part-00000-l.parquet",
    )
    kept_for_readers = lake / "silver" / "transactions" / ".staging" / "retired-1-old" / "data"
    kept_for_readers.mkdir(parents=True)
    pq.write_table(pa.table(silver["2026-01-01"]), kept_for_readers / "part-old.parquet")
    untouched = lake / "silver" / "transactions" / "arrival_date=2026-01-02" / "part-00000-s.parquet"
    before = _digest(untouched)

    report = erase_customer(settings, WHO)

    assert report["lake"] == {
        "bronze/transactions/arrival_date=2026-01-01": 1,
        "bronze/transactions/arrival_date=2026-01-03": 1,
        "silver/transactions/arrival_date=2026-01-01": 1,
        "silver/transactions/arrival_date=2026-01-03": 1,
        "silver/labels/arrival_date=2026-01-02": 2,
    }
    for table in ("bronze", "silver"):
        root = lake / table / "transactions"
        left = pa.concat_tables([pq.read_table(f) for f in sorted(root.glob("arrival_date=*/*.parquet"))])
        assert left.column("customer_id").to_pylist() == ["p-other", "p-other"]
        assert not (root / "arrival_date=2026-01-03").exists()  # only theirs: the partition is gone
    assert _digest(untouched) == before
    assert pq.read_table(labels).column("transaction_id").to_pylist() == ["tx00000000000000b8"]
    assert not kept_for_readers.exists() and not list(lake.rglob(".staging/*"))


def test_the_command_erases_reports_in_json_and_refuses_what_is_not_an_id(settings, monkeypatch):
    """`mlops erase` end to end in process: the report as its last JSON line; nothing reached silver here, so
    nothing is rebuilt (no Spark starts); an id with a character ids never have is refused, exit 2."""
    from typer.testing import CliRunner

    from core.settings import get_settings
    from mlops.cli import app

    monkeypatch.setenv("MLOPS_HOME", str(settings.home))
    monkeypatch.setenv("MLOPS_SERVING__PORT", str(free_port()))  # no scoring service there
    get_settings.cache_clear()
    try:
        done = CliRunner().invoke(app, ["erase", "--customer", WHO, "--json"])
        assert done.exit_code == 0, done.output
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["status"] == "erased" and report["rows_removed"] == 7 and report["rebuilt"] == {}
        assert report["live_state"]["status"] == "not_running"  # asked first: nothing there to forget
        assert "scoring service: not_running: no scoring service answers" in done.output
        assert report["online_store"] == {} and report["lake"] == {}
        assert report["held_by"] == {"dataset_revisions": {}, "model_versions": []}  # no revision yet
        refused = CliRunner().invoke(app, ["erase", "--customer", "c0000042; rm -rf /"])
        assert refused.exit_code == 2 and "is not a customer id" in refused.output
    finally:
        get_settings.cache_clear()
