"""An independent reading of landed files: classify every data line the way a strict reader would.

It shares no code with the generator beyond the column contract, so a manifest that lies fails the tests.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from datetime import date, datetime
from pathlib import Path

from pipelines.contracts import AMOUNT_MAX, REQUIRED_TRANSACTION_COLUMNS, TRANSACTION_COLUMNS


def audit_transactions(folder: Path) -> tuple[Counter, dict[str, str]]:
    """Count lines by what is wrong with them across the folder's transaction files; return the counts
    and the event time of every clean transaction by id."""
    arrival = date.fromisoformat(folder.name)
    counts: Counter = Counter()
    clean: dict[str, str] = {}
    for path in sorted(folder.glob("transactions-*")):
        json_lines = path.suffix == ".jsonl"
        lines = path.read_text(encoding="utf-8").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if json_lines:
            header, body = list(TRANSACTION_COLUMNS), lines
            if body and not set(header) <= _json_keys(body):
                header = []
        elif lines:
            header, body = lines[0].split(","), lines[1:]
        else:
            header, body = list(TRANSACTION_COLUMNS), []
        if set(header) != set(TRANSACTION_COLUMNS):
            counts["file_missing_column"] += 1
            counts["rows_in_rejected_files"] += len(body)
            continue
        if not body:
            counts["empty_files"] += 1
        for line in body:
            kind, row = _classify(line, header, json_lines, arrival, clean)
            counts[kind] += 1
            if kind == "clean":
                clean[row["transaction_id"]] = row["event_timestamp"]
    return counts, clean


def _json_keys(lines: list[str]) -> set[str]:
    keys: set[str] = set()
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            keys |= row.keys()
    return keys


def _classify(line: str, header: list[str], json_lines: bool, arrival: date, seen: dict) -> tuple[str, dict]:
    if json_lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return "malformed", {}
        if not isinstance(row, dict):
            return "malformed", {}
        if len(row) > len(header):
            return "extra_column", row
    else:
        tokens = next(csv.reader([line]))
        if len(tokens) > len(header):
            return "extra_column", {}
        if len(tokens) < len(header):
            return "malformed", {}
        row = {c: (t if t != "" else None) for c, t in zip(header, tokens, strict=True)}
    if any(row.get(c) is None for c in REQUIRED_TRANSACTION_COLUMNS):
        return "nulls", row
    try:
        amount = float(row["amount"]) if not isinstance(row["amount"], str) or not json_lines else None
        if amount is None:
            raise ValueError("a JSON amount must be a number")
        stamp = datetime.fromisoformat(str(row["event_timestamp"]).replace("Z", "+00:00"))
    except ValueError:
        return "wrong_type", row
    if not 0 < amount <= AMOUNT_MAX or stamp.date() != arrival:
        return "out_of_range", row
    if row["transaction_id"] in seen:
        return "duplicates", row
    return "clean", row


def read_labels(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.glob("labels-*")):
        if path.suffix == ".jsonl":
            rows += [json.loads(line) for line in path.read_text().splitlines() if line]
        else:
            with path.open(newline="") as handle:
                rows += list(csv.DictReader(handle))
    return rows
