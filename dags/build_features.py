"""
### Build features: silver -> gold -> GX -> DVC version (and Feast online store)

Scheduled on the `silver_transactions` asset. Each silver event names its arrival date (its `extra`);
a manual run can name a date, or several comma-separated, in the `arrival_date` param instead, or set the
`backfill` param to rebuild only what is out of date (after a feature is added: `mlops features backfill`
does the same from the command line). Gold is
kept by event date and reconciled by it: `plan_gold` lists the event dates to (re)build - those of the
arrivals' rows (an arrival carries events up to `MLOPS_INGEST__LATE_EVENT_DAYS` old), and every gold date
whose inputs changed since it was built (late events, an arrival that came out of order, a re-delivered
or rerun old date: each gold date records the arrivals it read and their file signatures). Each date
reads its rows and its 30-day lookback from silver, so it rewrites only its own gold partitions.

Each event date is one mapped instance of the task group `build_gold >> validate_gold >> materialize`: a date
that fails is failed on its own in the grid, the other dates go on, and clearing it retries that date
alone. `version_gold` waits for every date's validation (one DVC lock, one `fraud_features` event for the
run's dates, so a backfill starts one retrain), not for the online load.

Steps per date: point-in-time customer and merchant aggregates (Spark windows over event time, nothing
after an event's time enters its features; merchant fraud counts use only chargebacks reported by then),
the gold GX suites, a DVC snapshot of the date's gold (content hash, pushed to the remote; the revision is
returned for the model to record), then `feast apply` (idempotent) and materialization of the date's
explicit interval into the online store.

Beside the validation, **build_training_rows** writes each rebuilt date's training rows (every transaction's
model inputs, joined point in time once: training/feature_rows.py); a retrain reads its window's rows and
joins the labels known at its as-of date.

Two assets: `version_gold` emits `fraud_features` (gold validated and versioned: all a training set reads),
which starts the retrain DAG at once; `materialize` runs beside it and emits `fraud_features_online` (the
online store loaded: what a scorer reads). A retrain does not wait for the online load (at 1M transactions
a day, a minute or more of SQLite upserts: see docs/benchmarks.md), and a failed load does not hold training
back. The load runs at a lower CPU priority (`MLOPS_MATERIALIZE_NICENESS`, default 10): where it shares the
cores with the retrain's tasks, they get them first.

**Catching up on Airflow 3.3.** While a run is active (`max_active_runs=1`), further silver events queue;
Airflow 3.3 starts the next run on the first of them and keeps the others until a later event arrives
(apache/airflow#56050). When ingest runs many dates faster than this DAG (a backfill), run it by hand with
the `arrival_date` param for the dates that wait, or let the next arrival pick the queued events up.
Airflow's partitioned assets (AIP-76) would give one run per date natively; why they are not used yet is
in docs/data-engineers.md.
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task, task_group

from orchestration.alerts import failure_alerts
from orchestration.assets import FRAUD_FEATURES, FRAUD_FEATURES_ONLINE, SILVER_TRANSACTIONS
from orchestration.tasks import MAP_INDEX_BY_DATE, label_mapped_date, lower_cpu_priority, run_step

DEFAULT_ARGS = {
    "on_failure_callback": failure_alerts(),  # core/alerts.py: to the webhook and mail the settings name
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(hours=2),
}

with DAG(
    dag_id="build_features",
    schedule=[SILVER_TRANSACTIONS],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # one writer per gold table and one DVC repository lock
    default_args=DEFAULT_ARGS,
    tags=["fraud", "features", "spark", "dvc", "feast"],
    doc_md=__doc__,
    params={
        "arrival_date": Param(
            "", type="string", description="YYYY-MM-DD, several comma-separated; empty: the triggering events"
        ),
        "backfill": Param(
            False,
            type="boolean",
            description="with no arrival_date: rebuild every gold date built for other declarations (a "
            "feature added or changed) or whose inputs changed, oldest first; nothing else",
        ),
    },
) as dag:

    @task(
        doc_md="The arrival dates: from the arrival_date param, else the triggering silver events; none for "
        "a backfill (the backfill param), whose dates the plan finds."
    )
    def dates_to_compute(params: dict, triggering_asset_events=None) -> list[str]:
        from datetime import date

        if params.get("backfill") and not params.get("arrival_date"):
            return []
        if params.get("arrival_date"):
            dates = [d.strip() for d in params["arrival_date"].split(",") if d.strip()]
            for value in dates:
                try:
                    date.fromisoformat(value)
                except ValueError:
                    raise ValueError(
                        f"arrival_date param: {value!r} is not a date; give YYYY-MM-DD or several, "
                        "comma-separated (2026-01-02,2026-01-03)"
                    ) from None
            return sorted(set(dates))
        events = triggering_asset_events[SILVER_TRANSACTIONS] if triggering_asset_events else []
        dates = sorted({e.extra["arrival_date"] for e in events if e.extra and "arrival_date" in e.extra})
        if not dates:
            raise ValueError(
                "no date to compute: the run has no silver event with an arrival_date and no param"
            )
        return dates

    @task(
        doc_md="Silver -> gold customer and merchant features for the date.",
        map_index_template=MAP_INDEX_BY_DATE,
    )
    def build_gold(day: str) -> dict:
        from datetime import date

        from pipelines.gold import job

        label_mapped_date(day)
        return run_step(job.build_gold, date.fromisoformat(day))

    @task(
        doc_md="GX suites gold_customer_features and gold_merchant_features.",
        map_index_template=MAP_INDEX_BY_DATE,
    )
    def validate_gold(day: str) -> dict:
        from datetime import date

        from pipelines.gold import job

        label_mapped_date(day)
        return {"validation": run_step(job.validate_gold, date.fromisoformat(day))}

    @task(
        outlets=[FRAUD_FEATURES_ONLINE],
        map_index_template=MAP_INDEX_BY_DATE,
        # One date at a time: each load reads the stored event times, then writes; two dates loading at once
        # (a late event's date beside its arrival's) could let the older one overwrite the newer value.
        max_active_tis_per_dagrun=1,
        doc_md="feast apply, then materialize the date's interval online. Emits fraud_features_online.",
    )
    def materialize(day: str, outlet_events=None) -> dict:
        from datetime import date

        from core.settings import get_settings
        from features.materialize import materialize_date

        label_mapped_date(day)
        # Off the critical path, beside the retrain it started: the retrain's tasks get the cores first.
        with lower_cpu_priority(get_settings().materialize_niceness) as niceness:
            result = run_step(materialize_date, date.fromisoformat(day))
        outlet_events[FRAUD_FEATURES_ONLINE].extra = {"event_dates": [day]}
        return {**result, "niceness": niceness}

    @task_group(prefix_group_id=False)
    def gold_for_date(day: str) -> None:
        """One date's chain; mapped, so each date is its own task instances (failed and retried alone)."""
        build_gold(day) >> validate_gold(day) >> materialize(day)  # only validated gold goes online

    @task(
        outlets=[FRAUD_FEATURES],
        doc_md="DVC snapshot of each date's gold; returns the dataset revisions. Emits fraud_features.",
    )
    def version_gold(dates: list[str], outlet_events=None) -> list[dict]:
        from datetime import date

        from pipelines.gold import job

        results = [run_step(job.version_gold, date.fromisoformat(d)) for d in dates]
        # One event for the run's dates, so a backfill of several dates starts one retrain, as of the newest.
        outlet_events[FRAUD_FEATURES].extra = {"event_dates": sorted(dates)}
        return results

    @task(
        doc_md="Each rebuilt event date's training rows (every transaction's model inputs, built once: a "
        "retrain reads them and joins the labels), and those of the later dates that read its gold."
    )
    def build_training_rows(dates: list[str]) -> dict:
        from datetime import date

        from training.feature_rows import build_feature_rows

        return run_step(build_feature_rows, [date.fromisoformat(d) for d in dates])

    @task(
        doc_md="The event dates to (re)build for these arrivals: their own, those their late events touch, "
        "and every gold date whose inputs or declarations changed since it was built (out-of-order or "
        "re-delivered dates, a feature added: its backfill)."
    )
    def plan_gold(arrivals: list[str]) -> list[str]:
        from datetime import date

        from pipelines.gold import job

        plan = run_step(job.plan_gold, [date.fromisoformat(a) for a in arrivals])
        if not plan["event_dates"]:  # a backfill with every date up to date: no build, no version, no retrain
            from airflow.sdk.exceptions import AirflowSkipException

            raise AirflowSkipException("every gold date is built for today's declarations and inputs")
        return plan["event_dates"]

    dates = plan_gold(dates_to_compute())
    gold_for_date.expand(day=dates)
    # Versioning waits for every date's validation and the training rows (what a retrain reads), not for
    # the online load: a retrain does not wait on it. The rows are built beside the validation.
    versioned = version_gold(dates)
    dag.get_task("validate_gold") >> versioned
    dag.get_task("build_gold") >> build_training_rows(dates) >> versioned
