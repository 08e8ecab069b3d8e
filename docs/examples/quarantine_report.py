"""Worked example of docs/data-engineers.md: the quarantine report of an arrival date.

In the product this module would be `pipelines/ingest/quarantine_report.py`; it lives in docs/examples so
that nothing of the example is deployed (its tests put docs/examples on the import path).

`summarize_quarantine` is pure: a reconciliation record in, a report out. `write_quarantine_report` is the
I/O around it: it reads the date's record (written by ingestion) and writes the report to the date's own
file, so a rerun replaces exactly what it wrote.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import PipelineError
from pipelines.lake import Tables, read_json, write_json

if TYPE_CHECKING:
    from core.settings import Settings


class MissingReconciliationError(PipelineError):
    """The date has not been ingested (yet): there is nothing to report on."""


def report_path(lake: Path, day: date) -> Path:
    return lake / "reports" / "quarantine" / f"arrival_date={day.isoformat()}.json"


def arrival_dates(param: str | None, event_extras: list[dict | None]) -> list[str]:
    """The dates a run reports on: the `arrival_date` param when set, else those its silver events name."""
    if param:
        return [date.fromisoformat(param).isoformat()]
    dates = sorted({extra["arrival_date"] for extra in event_extras if extra and "arrival_date" in extra})
    if not dates:
        raise ValueError(
            "no date to report on: the run has no silver_transactions event naming an arrival_date and "
            "no arrival_date param; trigger it with {'arrival_date': 'YYYY-MM-DD'}"
        )
    return dates


def summarize_quarantine(record: dict[str, Any]) -> dict[str, Any]:
    """Every row of the date that is in quarantine, by reason code: the bronze reasons, plus `duplicate`
    for the copies build_silver removed (absent until silver is built)."""
    counts = dict(record["quarantined_by_reason"])
    counts["duplicate"] = record.get("duplicates_removed", 0)
    by_reason = {
        reason: count for reason, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])) if count
    }
    quarantined = sum(by_reason.values())
    return {
        "arrival_date": record["arrival_date"],
        "ingest_status": record["status"],
        "rows_in": record["rows_in"],
        "rows_quarantined": quarantined,
        "quarantine_share": round(quarantined / record["rows_in"], 6) if record["rows_in"] else 0.0,
        "by_reason": by_reason,
        "top_reason": next(iter(by_reason), None),
    }


def write_quarantine_report(settings: Settings, day: date) -> dict[str, Any]:
    """Read the reconciliation record of `day`, write its quarantine report; return the report."""
    record_path = Tables(settings.lake).reconciliation(day)
    record = read_json(record_path)
    if record is None:
        raise MissingReconciliationError(
            f"arrival {day} has no reconciliation record at {record_path}: ingest the date first "
            f"(DAG ingest_transactions, or `mlops ingest --date {day}`), then rerun this task"
        )
    report = summarize_quarantine(record)
    out = report_path(settings.lake, day)
    write_json(out, report)
    return {**report, "report": str(out)}
