"""Dated folders expire by the data's own newest date, never the calendar (core/retention.py)."""

from __future__ import annotations

from datetime import date

from core.retention import expire_dated_folders


def _folders(root, names):
    for name in names:
        (root / name).mkdir(parents=True)
    (root / "date=2026-01-01.json").write_text("{}")  # a file, not a folder: never touched


def test_folders_older_than_the_retention_before_the_newest_go_and_the_rest_stay(tmp_path):
    _folders(tmp_path, ["date=2025-12-01", "date=2025-12-02", "date=2026-01-01", "date=notadate", "other"])
    assert expire_dated_folders(tmp_path, "date=", 30) == ["date=2025-12-01"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["date=2025-12-02", "date=2026-01-01", "date=2026-01-01.json", "date=notadate", "other"]


def test_a_given_newest_date_counts_instead_and_nothing_dated_is_nothing_removed(tmp_path):
    _folders(tmp_path, ["2026-03-01", "2026-03-05"])
    assert expire_dated_folders(tmp_path, "", 2, newest=date(2026, 3, 4)) == ["2026-03-01"]
    assert expire_dated_folders(tmp_path / "absent", "date=", 1) == []
