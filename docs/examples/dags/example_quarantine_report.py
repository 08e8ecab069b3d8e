"""
### Example: quarantine report per arrival date

The worked example of `docs/data-engineers.md` (not deployed: copy it into `dags/` to run it).

Scheduled on the `silver_transactions` asset: each silver event names its arrival date, and the run
reports on exactly those dates (a manual run takes an `arrival_date` param instead). For each date it
reads the reconciliation record that ingestion wrote (`lake/reconciliation/transactions/`) and writes how
many of the date's rows are in quarantine, by reason code, to `lake/reports/quarantine/arrival_date=D.json`;
a rerun replaces exactly that file. A date that was never ingested fails the task at once, without
retries, naming the missing record.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from orchestration.assets import SILVER_TRANSACTIONS
from orchestration.tasks import MAP_INDEX_BY_DATE, label_mapped_date, run_step

DEFAULT_ARGS = {
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "execution_timeout": timedelta(minutes=10),
}

with DAG(
    dag_id="example_quarantine_report",
    schedule=[SILVER_TRANSACTIONS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["fraud", "quality", "example"],
    doc_md=__doc__,
    params={"arrival_date": Param("", type="string", description="YYYY-MM-DD; empty: the triggering events")},
):

    @task(doc_md="The dates to report on: the arrival_date param, or those the silver events name.")
    def dates_to_report(params: dict, triggering_asset_events=None) -> list[str]:
        from quarantine_report import arrival_dates

        events = triggering_asset_events[SILVER_TRANSACTIONS] if triggering_asset_events else []
        return arrival_dates(params.get("arrival_date"), [event.extra for event in events])

    @task(
        doc_md="The rows of one date in quarantine by reason, from its reconciliation record.",
        map_index_template=MAP_INDEX_BY_DATE,
    )
    def report_quarantine(day: str) -> dict:
        from datetime import date

        from quarantine_report import write_quarantine_report

        label_mapped_date(day)
        return run_step(write_quarantine_report, date.fromisoformat(day))

    report_quarantine.expand(day=dates_to_report())  # one task instance per date: failed and retried alone
