"""Folders named by date (`<prefix>YYYY-MM-DD`) deleted once they are older than a retention, counted back
from the newest of them: the data's own dates, never the calendar, so a replayed or late feed is not emptied
by the clock. The scoring service expires its log with it as it writes; the `enforce_retention` DAG does the
same when the service is idle or down (pipelines/privacy.py)."""

from __future__ import annotations

import re
import shutil
from datetime import date, timedelta
from pathlib import Path

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def dated_folders(root: Path, prefix: str) -> dict[date, Path]:
    """The folders `<prefix>YYYY-MM-DD` under `root`, by their date (other names are left out)."""
    if not root.is_dir():
        return {}
    found = {}
    for path in root.iterdir():
        name = path.name.removeprefix(prefix)
        if path.is_dir() and path.name.startswith(prefix) and _DATE.fullmatch(name):
            found[date.fromisoformat(name)] = path
    return found


def expire_dated_folders(root: Path, prefix: str, keep_days: int, newest: date | None = None) -> list[str]:
    """Delete the folders dated more than `keep_days` before `newest` (default: the newest folder's date);
    the names deleted, oldest first."""
    folders = dated_folders(root, prefix)
    newest = newest or max(folders, default=None)
    if newest is None:
        return []
    oldest = newest - timedelta(days=keep_days)
    gone = [folders[day] for day in sorted(folders) if day < oldest]
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    return [folder.name for folder in gone]
