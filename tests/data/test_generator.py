"""The generator's contract: deterministic files, manifests that reconcile with the files line by line."""

from __future__ import annotations

import hashlib
import json
from datetime import date, datetime
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from mlops.cli import app
from pipelines.synthetic.faults import FaultKind, parse_faults
from pipelines.synthetic.landing import MANIFEST_NAME, GenerateRequest, generate_landing, read_manifest
from tests.data.landing_audit import audit_transactions, read_labels

ALL_ROW_FAULTS = (
    "malformed=0.01,wrong_type=0.012,nulls=0.015,out_of_range=0.01,extra_column=0.008,"
    "duplicates=0.02,drift=0.05"
)


def _generate(landing: Path, **overrides) -> list[dict]:
    args = dict(start=date(2026, 1, 1), days=2, rows_per_day=1500, seed=7, landing=landing)
    args.update(overrides)
    return generate_landing(GenerateRequest(**args))


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_same_arguments_give_byte_identical_files(tmp_path, fmt):
    faults = parse_faults(ALL_ROW_FAULTS + ",missing_column=0.5,empty=0.5")
    _generate(tmp_path / "a", fmt=fmt, faults=faults)
    _generate(tmp_path / "b", fmt=fmt, faults=faults)
    first, second = _digests(tmp_path / "a"), _digests(tmp_path / "b")
    assert first == second
    assert len(first) >= 6


def test_another_seed_gives_other_data(tmp_path):
    _generate(tmp_path / "a")
    _generate(tmp_path / "b", seed=8)
    a, b = _digests(tmp_path / "a"), _digests(tmp_path / "b")
    assert a.keys() == b.keys()
    assert all(a[name] != b[name] for name in a if name.endswith("transactions-00000.csv"))


def test_dates_generated_one_at_a_time_equal_the_range_generated_at_once(tmp_path):
    _generate(tmp_path / "range", days=4)
    for offset in range(4):
        day = date(2026, 1, 1 + offset)
        _generate(tmp_path / "daily", start=day, days=1, feed_start=date(2026, 1, 1))
    assert _digests(tmp_path / "range") == _digests(tmp_path / "daily")


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_manifest_counts_reconcile_with_an_independent_reading_of_the_files(tmp_path, fmt):
    manifests = _generate(tmp_path, fmt=fmt, faults=parse_faults(ALL_ROW_FAULTS), days=3)
    for manifest in manifests:
        counts, _ = audit_transactions(tmp_path / manifest["arrival_date"])
        injected = manifest["faults"]
        for kind in ("malformed", "wrong_type", "nulls", "out_of_range", "extra_column", "duplicates"):
            assert counts[kind] == injected[kind] > 0, (manifest["arrival_date"], kind)
        generated = manifest["transactions"]["generated"]
        replaced = sum(
            injected[k] for k in ("malformed", "wrong_type", "nulls", "out_of_range", "extra_column")
        )
        assert counts["clean"] == generated - replaced
        assert (
            sum(counts.values())
            == manifest["transactions"]["rows_written"]
            == generated + injected["duplicates"]
        )
        assert injected["drift"] == round(0.05 * generated)


def test_a_clean_feed_has_only_clean_rows(tmp_path):
    (manifest,) = _generate(tmp_path, days=1)
    counts, clean = audit_transactions(tmp_path / "2026-01-01")
    assert counts == {"clean": manifest["transactions"]["generated"]}
    # every row and file kind counted, none hit (camouflage is a way of drawing fraud, not a row's fault)
    assert manifest["faults"] == {k.value: 0 for k in FaultKind if k is not FaultKind.CAMOUFLAGE}
    assert len(clean) == manifest["transactions"]["rows_written"]


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_file_faults_are_recorded_with_file_and_column(tmp_path, fmt):
    manifests = _generate(tmp_path, fmt=fmt, days=1, faults=parse_faults("missing_column=1,empty=1"))
    (manifest,) = manifests
    missing, empty = manifest["file_faults"]
    assert missing["kind"] == "missing_column" and empty["kind"] == "empty"
    folder = tmp_path / "2026-01-01"
    first = (folder / missing["file"]).read_text().splitlines()
    if fmt == "csv":
        assert missing["column"] not in first[0].split(",")
        assert len((folder / empty["file"]).read_text().splitlines()) == 1  # header only
    else:
        assert all(missing["column"] not in json.loads(line) for line in first[:50])
        assert (folder / empty["file"]).stat().st_size == 0
    counts, _ = audit_transactions(folder)
    assert counts["file_missing_column"] == 1 and counts["empty_files"] == 1
    assert counts["rows_in_rejected_files"] == manifest["transactions"]["files"][0]["rows"]


def test_chargebacks_refer_to_earlier_landed_transactions_and_arrive_on_their_date(tmp_path):
    manifests = _generate(tmp_path, days=6, rows_per_day=3000)
    event_time: dict[str, str] = {}
    labels_total = 0
    for manifest in manifests:
        folder = tmp_path / manifest["arrival_date"]
        _, clean = audit_transactions(folder)
        event_time.update(clean)
        labels = read_labels(folder)
        assert len(labels) == manifest["labels"]["rows"]
        for label in labels:
            assert label["transaction_id"] in event_time, label
            assert label["label_timestamp"].startswith(manifest["arrival_date"])
            assert label["label_timestamp"] > event_time[label["transaction_id"]]
            assert str(label["is_fraud"]) == "1"
        labels_total += len(labels)
    fraud = sum(m["transactions"]["fraud"] for m in manifests)
    assert 0 < labels_total < fraud  # late labels: some chargebacks have not arrived yet


def test_manifest_lists_files_with_their_sha256(tmp_path):
    (manifest,) = _generate(tmp_path, days=1)
    folder = tmp_path / "2026-01-01"
    assert read_manifest(folder) == manifest
    for info in manifest["transactions"]["files"] + [manifest["labels"]]:
        assert hashlib.sha256((folder / info["name"]).read_bytes()).hexdigest() == info["sha256"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2026-01-01"]  # no staging left behind
    assert (folder / MANIFEST_NAME).is_file()


def test_an_empty_arrival_writes_header_only_files(tmp_path):
    (manifest,) = _generate(tmp_path, days=1, rows_per_day=0)
    assert manifest["transactions"]["rows_written"] == 0
    assert (tmp_path / "2026-01-01" / "transactions-00000.csv").read_text().count("\n") == 1


def test_rows_are_split_into_part_files(tmp_path):
    (manifest,) = _generate(tmp_path, days=1, rows_per_day=2000, rows_per_file=600)
    rows = [f["rows"] for f in manifest["transactions"]["files"]]
    assert rows[:-1] == [600] * (len(rows) - 1) and sum(rows) == manifest["transactions"]["generated"]


def test_cli_prints_one_json_line_last(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--start",
            "2026-02-01",
            "--days",
            "2",
            "--rows-per-day",
            "300",
            "--landing",
            str(tmp_path),
            "--faults",
            "duplicates=0.1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "ok" and summary["dates"] == ["2026-02-01", "2026-02-02"]
    assert summary["rows_written"] == sum(
        read_manifest(tmp_path / d)["transactions"]["rows_written"] for d in summary["dates"]
    )


def test_cli_rejects_an_unknown_fault_kind_by_name(tmp_path):
    result = CliRunner().invoke(
        app, ["generate", "--start", "2026-02-01", "--landing", str(tmp_path), "--faults", "dupes=0.1"]
    )
    assert result.exit_code == 2
    assert "unknown fault kind 'dupes'" in result.output
    assert not any(tmp_path.iterdir())


def test_cli_default_landing_is_under_mlops_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLOPS_HOME", str(tmp_path / "home"))
    result = CliRunner().invoke(
        app, ["generate", "--start", "2026-03-01", "--days", "1", "--rows-per-day", "100", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "home" / "landing" / "2026-03-01" / MANIFEST_NAME).is_file()
    assert datetime.fromisoformat("2026-03-01")  # the date format the CLI takes


def test_the_camouflage_fault_disguises_fraud_as_the_customers_own_spending(tmp_path):
    """A degradation, not drift: with camouflage=1.0 every fraud burst buys at a home merchant, barely above
    the customer's usual amount, on its usual channel; the day's chargebacks still name its own landed
    transactions (they are drawn with the same share)."""
    from pipelines.synthetic.simulate import CHANNEL_ONLINE, chargebacks_of_day, plan_day, rows_for_day
    from pipelines.synthetic.world import build_world

    day = date(2026, 1, 1)
    world = build_world(7, 300, 200)
    rows = rows_for_day(20_000, day)
    usual, disguised = (plan_day(world, day, rows, 7, share).fraud for share in (0.25, 1.0))
    assert usual.key.tolist() == disguised.key.tolist()  # the same frauds, differently dressed
    online = {
        name: float(np.mean(b.channel == CHANNEL_ONLINE))
        for name, b in (("usual", usual), ("hidden", disguised))
    }
    assert online["hidden"] < online["usual"] / 2, online
    keys, _ = chargebacks_of_day(world, day, rows, 7, 1.0)
    assert set(keys.tolist()) >= {k for k, t in zip(disguised.key, disguised.label_ms, strict=True) if t >= 0}

    manifests = _generate(tmp_path, days=3, rows_per_day=3000, faults=parse_faults("camouflage=1.0"))
    event_time: dict[str, str] = {}
    for manifest in manifests:
        folder = tmp_path / manifest["arrival_date"]
        event_time.update(audit_transactions(folder)[1])
        for label in read_labels(folder):
            assert label["transaction_id"] in event_time, label
