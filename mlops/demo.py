"""The main job on the embedded stack: land a synthetic feed, ingest and build features day by day, train
and gate a model, then land one more day and run the chain again so the gate decides on a challenger.

Two ways to run it, with the same summary (the dictionary `mlops demo --json` prints):

- through Airflow (`mlops demo`, the default): scripts/up.sh starts the stack (api-server, scheduler,
  dag-processor, triggerer, Spark Connect, MLflow) under $MLOPS_HOME; the demo unpauses the fraud DAGs and
  starts a backfill of `ingest_transactions` (one run per arrival date, in order, each waiting for its date's
  arrival); the history lands a day at a time, each once the day before has reached the retrain DAG; each
  run's `silver_transactions` event schedules `build_features`, whose `fraud_features` event schedules
  `retrain_fraud_model`. Then the last day lands, the chain runs again and the gate decides. The demo
  follows the chain through the REST API with the official client, apache-airflow-client (asset events name
  the runs they started), and reads rows, revisions, versions and decisions from the tasks' XComs (per map
  index for the tasks mapped over dates) and the time per stage from their task instances.
- in one process (`mlops demo --in-process`): every stage calls the same functions the DAG tasks call
  (mlops.chain, training.steps), in order, without Airflow.

`mlops demo --continue` lands only the next day of the feed already under $MLOPS_HOME's landing zone (a
demo's, or the end-to-end benchmark's bulk history) and runs it through the chain, either way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta

from rich.console import Console
from rich.table import Table

from core.clock import StageClock
from core.settings import Settings

DEMO_FAULTS = "duplicates=0.01,malformed=0.002,nulls=0.002"
INGEST, FEATURES, RETRAIN = "ingest_transactions", "build_features", "retrain_fraud_model"
MONITOR = "monitor_fraud_model"
APPROVE = "approve_fraud_model"
DAG_IDS = ("synthetic_landing", INGEST, FEATURES, RETRAIN)
# Consumers first: Airflow queues an asset event only for the DAGs that are unpaused when it is emitted.
# synthetic_landing stays paused: the demo lands the feed itself, for its own dates. The approval DAG does
# nothing unless a retrain asks for a sign-off (approval.enabled, or its `require_approval` param).
UNPAUSE_ORDER = (APPROVE, RETRAIN, FEATURES, INGEST)
SENSOR_TASK = "wait_for_arrival"
STAGE_OF = {INGEST: "ingest", FEATURES: "features", RETRAIN: "retrain"}


class DemoError(RuntimeError):
    """The demo cannot go on; the message says which run or task and where to look."""


def _check_days(days: int, feed_start: date | None) -> None:
    if days < 2 and feed_start is None:
        raise ValueError(
            "the demo needs at least 2 days: one to train the champion, one more for a challenger"
        )


def next_arrival(settings: Settings) -> tuple[date, date]:
    """(first arrival date, the day after the last one) of the feed landed under settings.landing: what
    `mlops demo --continue` lands next."""
    folders = settings.landing.iterdir() if settings.landing.is_dir() else []
    landed = []
    for folder in folders:
        try:
            landed.append(date.fromisoformat(folder.name))
        except ValueError:
            continue
    if not landed:
        raise DemoError(
            f"nothing landed under {settings.landing} to continue from; run `mlops demo` (or the end-to-end "
            "benchmark's set-up) on this MLOPS_HOME first"
        )
    return min(landed), max(landed) + timedelta(days=1)


def run_in_process(
    settings: Settings,
    start: date,
    days: int,
    rows_per_day: int,
    seed: int,
    epochs: int,
    console: Console,
    feed_start: date | None = None,
    score: bool = True,
) -> dict:
    """The whole loop in this process, stage after stage (no Airflow). With `feed_start` (continuing a
    feed that began then), `days` from `start` go through the chain on what is already there; with
    `score`, the last day is then scored through the scoring service."""
    from mlops import chain
    from pipelines.ingest.job import ingest
    from pipelines.synthetic.landing import land_synthetic
    from training import steps
    from training.tuning import train_config

    _check_days(days, feed_start)
    settings.ensure_dirs()
    clock = StageClock()
    started = time.perf_counter()
    manifests = clock.run(
        "land",
        lambda: {
            "manifests": land_synthetic(
                settings,
                start=start,
                days=days,
                rows_per_day=rows_per_day,
                seed=seed,
                faults=DEMO_FAULTS,
                feed_start=feed_start,
            )
        },
    )["manifests"]
    console.print(f"landed {days} arrival dates in {settings.landing}")
    config = train_config(settings, epochs=epochs)
    daily: list[dict] = []
    retrains: list[dict] = []
    feature_steps: dict[str, float] = {}  # the last day's seconds per features step

    def through_features(day: date) -> None:
        console.print(f"{day}: ingest (Spark -> bronze + quarantine -> GX -> silver) ...")
        ingested = clock.run("ingest", lambda: ingest(settings, day, f"demo-{day}"))
        console.print(f"{day}: features (gold -> GX -> DVC -> Feast online store) ...")
        built = clock.run("features", lambda: chain.features(settings, day))
        feature_steps.clear()
        feature_steps.update(built["seconds_per_step"])
        daily.append({"date": day.isoformat(), **_day_row(ingested, built)})

    def retrain(day: date) -> None:
        console.print(
            f"retrain as of {day}: training set -> train -> evaluate -> register -> gate -> ONNX ..."
        )
        record = clock.run("retrain", lambda: steps.retrain(settings, day, config, dag_id="mlops-demo"))
        retrains.append(record)

    dates = [start + timedelta(days=i) for i in range(days)]
    for day in dates[:-1]:
        through_features(day)
    if len(dates) > 1:
        retrain(dates[-2])
    console.print(f"one more day arrives: {dates[-1]}")
    before, arrived = dict(clock.seconds), time.perf_counter()
    through_features(dates[-1])
    retrain(dates[-1])
    scoring = _score_if_champion(settings, dates[-1], console, clock) if score else []
    arrival = {
        "seconds": time.perf_counter() - arrived,
        "task_seconds_per_stage": {
            stage: clock.seconds[stage] - before.get(stage, 0.0)
            for stage in ("ingest", "features", "retrain")
        },
        # the last day's steps, named as the DAGs' tasks (ingest runs as one step here)
        "seconds_per_step": {
            **{f"build_features.{k}": v for k, v in feature_steps.items()},
            **{f"retrain_fraud_model.{k}": v for k, v in retrains[-1].get("seconds_per_step", {}).items()},
        },
    }

    _print_tables(console, daily, retrains, _stage_table(clock.seconds))
    console.print(
        "Look further: `mlops history` (every gate decision), `mlops rollback`, "
        f"`mlflow ui --backend-store-uri {settings.mlflow_tracking_uri}`, or `make up` and `mlops demo` to "
        "watch the same loop in Airflow"
    )
    return {
        "status": "ok",
        "mode": "in-process",
        **_data_summary(settings, manifests, daily),
        "retrains": [_retrain_row(r) for r in retrains],
        "champion_version": retrains[-1].get("champion_version"),
        "scoring": scoring,
        "seconds_per_stage": clock.seconds,
        "arrival_to_model": arrival,
        "seconds": time.perf_counter() - started,
    }


def _day_row(ingested: dict, built: dict) -> dict:
    return {
        "rows_in": ingested["rows_in"],
        "rows_quarantined": ingested["rows_quarantined"],
        "rows_silver": ingested["rows_silver"],
        "rows_gold": built["rows_gold"],
        "dataset_rev": built["dataset_rev"],
        "rows_materialized": built["rows_materialized"],
    }


def _retrain_row(record: dict) -> dict:
    keys = ("as_of", "training_set_rev", "model_version", "auc_pr", "champion_auc_pr", "decision", "reason",
            "champion_version", "previous_champion", "run_id", "status")  # fmt: skip
    return {key: record.get(key) for key in keys}


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def _print_tables(console: Console, daily: list[dict], retrains: list[dict], stages: Table) -> None:
    columns = ("rows_in", "rows_quarantined", "rows_silver", "rows_gold", "dataset_rev", "rows_materialized")
    table = Table(
        "date", "rows in", "quarantined", "silver", "gold rows", "dataset rev (DVC)", "online rows",
        title="data: landing -> silver -> gold -> Feast",
    )  # fmt: skip
    for row in daily:
        table.add_row(row["date"], *(str(row[k]) for k in columns))
    console.print(table)
    model_columns = ("as_of", "training_set_rev", "model_version", "auc_pr", "champion_auc_pr", "decision",
               "champion_version")  # fmt: skip
    table = Table(
        "as of", "training set", "model", "AUC-PR", "champion AUC-PR", "decision", "champion",
        title="models: train -> gate (holdout AUC-PR)",
    )  # fmt: skip
    for record in retrains:
        row = _retrain_row(record)
        table.add_row(*(_fmt(row[k]) for k in model_columns))
    console.print(table)
    for record in retrains:
        what = (
            f"model {record['model_version']}" if record.get("model_version") else f"as of {record['as_of']}"
        )
        console.print(f"gate, {what}: {record.get('decision')}: {record.get('reason')}")
    console.print(stages)


def _stage_table(seconds: dict[str, float]) -> Table:
    table = Table("stage", "seconds", title="time per stage")
    for stage, value in seconds.items():
        table.add_row(stage, f"{value:.1f}")
    return table


# --- through Airflow ---------------------------------------------------------------------------------------


def run_through_airflow(
    settings: Settings,
    start: date,
    days: int,
    rows_per_day: int,
    seed: int,
    epochs: int,
    console: Console,
    stop: bool = False,
    timeout: float = 3600.0,
    feed_start: date | None = None,
    drift_drill: bool = True,
    score: bool = True,
) -> dict:
    """Start the stack, replay `days` arrival dates through the DAGs and follow their asset chain, then
    (with `score`) score the last day through the scoring service and (with `drift_drill` too) show
    monitoring at work: a drifted copy of the day scored and checked, and the retrain the drift starts. With
    `feed_start` (continuing a feed that began then), the dates continue what is already there."""
    from mlops import stack as embedded
    from mlops.airflow_api import AirflowAPI
    from pipelines.synthetic.landing import land_synthetic

    _check_days(days, feed_start)
    settings.ensure_dirs()
    dates = [start + timedelta(days=i) for i in range(days)]
    history, last = dates[:-1], dates[-1]
    clock = StageClock()
    started = time.perf_counter()
    deadline = time.monotonic() + timeout

    def echo(line: str) -> None:
        console.print(line, markup=False, highlight=False, soft_wrap=True)

    def land(first: date, count: int) -> list[dict]:
        return land_synthetic(
            settings,
            start=first,
            days=count,
            rows_per_day=rows_per_day,
            seed=seed,
            faults=DEMO_FAULTS,
            feed_start=feed_start or start,
        )

    maturity = settings.training.label_maturity_days
    if feed_start is None and days < maturity + 2:
        console.print(
            f"[yellow]Labels count as known after {maturity} days (MLOPS_TRAINING__LABEL_MATURITY_DAYS): "
            f"with {days} days the history trains no champion, so no challenger meets the gate; use --days "
            f"{maturity + 2} or more.[/]"
        )
    console.rule("the stack: scripts/up.sh")
    # Task processes inherit the scheduler's environment: that is how the epochs reach the train task.
    stack = clock.run("stack", lambda: embedded.up(settings, {"MLOPS_TRAINING__EPOCHS": str(epochs)}, echo))
    if stack.already_running:
        console.print(
            "[yellow]The stack was already running: its components keep the settings they started with "
            "(MLOPS_TRAINING__*, ...); `make down` first for --epochs to apply.[/]"
        )
    api = AirflowAPI(stack.airflow_url, stack.username, stack.password)
    api.on_poll = embedded.StackWatchdog(
        settings, lambda: embedded.up(settings, {"MLOPS_TRAINING__EPOCHS": str(epochs)}, echo), echo
    )
    try:
        _wait_for_dags(api, deadline, console)
        _refuse_replay(api, settings, dates)
        for dag_id in UNPAUSE_ORDER:
            api.unpause(dag_id)
        console.print(
            f"unpaused {', '.join(UNPAUSE_ORDER)} ({DAG_IDS[0]} stays paused: the demo lands the feed)"
        )

        manifests = clock.run("land", lambda: land(start, 1)) if history else []
        if history:
            console.print(f"landed {start} in {settings.landing}")
        api.backfill(INGEST, dates[0], last)
        ingest_runs = _backfill_runs(api, dates, deadline)
        console.print(
            f"backfill of {INGEST}: one run per arrival date, oldest first; each waits for its date's "
            "arrival (deferred sensor)"
        )

        def next_arrival(index: int) -> None:
            # The history arrives a day at a time, each once the day before has reached the retrain DAG:
            # Airflow 3.3 consumes only the first of several asset events queued for a DAG at
            # max_active_runs and keeps the rest until a later event (apache/airflow#56050), which would
            # stall a chain fed faster than its consumers run.
            if index + 1 < len(history):
                day = history[index + 1]
                manifests.extend(clock.run("land", lambda: land(day, 1)))
                console.print(f"landed {day}")

        first: dict[str, list[str]] = {FEATURES: [], RETRAIN: []}
        if history:
            console.rule(f"history: {history[0]} .. {history[-1]}")
            first = _follow_chain(api, [ingest_runs[d] for d in history], deadline, console, next_arrival)
        console.rule(f"one more day arrives: {last}")
        manifests += clock.run("land", lambda: land(last, 1))
        arrived = datetime.now(UTC)  # the producer's _SUCCESS marker is written last
        console.print(f"landed {last}; the waiting {INGEST} run picks it up")
        second = _follow_chain(api, [ingest_runs[last]], deadline, console)
        arrival = _arrival_to_model(api, {INGEST: [ingest_runs[last]], **second}, arrived)
        scoring = _score_if_champion(settings, last, console, clock) if score else []
        drill = _drift_drill(api, settings, last, console, clock, deadline) if scoring and drift_drill else {}

        runs = {
            INGEST: [ingest_runs[d] for d in dates],
            FEATURES: first[FEATURES] + second[FEATURES],
            RETRAIN: first[RETRAIN] + second[RETRAIN],
        }
        daily = _daily_rows(api, runs)
        retrains = [_retrain_record(api, run_id) for run_id in runs[RETRAIN]]
        timings = {dag_id: _run_timings(api, dag_id, run_ids) for dag_id, run_ids in runs.items()}
        others = _other_runs(api, runs)
    finally:
        api.close()

    seconds = {**clock.seconds, **{STAGE_OF[d]: t["task_seconds"] for d, t in timings.items()}}
    _print_tables(console, daily, retrains, _airflow_stage_table(clock.seconds, timings))
    console.print(
        f"one more day, arrival to gate decision: {arrival['seconds']:.1f}s, of which tasks ran "
        f"{arrival['busy_seconds']:.1f}s and Airflow's scheduling between them took "
        f"{arrival['overhead_seconds']:.1f}s ({arrival['overhead_share']:.0%})"
    )
    for line in others:
        console.print(f"[dim]{line}[/]")
    trained = [r for r in retrains if r["decision"] != "skipped"]
    if stop:
        console.rule("stopping the stack: scripts/down.sh")
        embedded.down(echo=echo)
    console.print(
        f"Airflow UI: {stack.airflow_url}  (login: {stack.username} / {stack.password}; approvals are "
        f"answered by another user, e.g. risk-officer: every password is in {stack.password_file})\n"
        f"MLflow UI:  {stack.mlflow_url}  (model fraud-detector, alias champion)\n"
        + (
            "The stack is stopped; `make up` starts it again on the same MLOPS_HOME."
            if stop
            else "The stack stays up: `make down` stops it (`mlops demo --down` stops it at the end)."
        )
        + "\nMore: `mlops history` (every gate decision), `mlops rollback`, `mlops retrain --date ...`"
    )
    return {
        "status": "ok",
        "mode": "airflow",
        **_data_summary(settings, manifests, daily),
        "retrains": [{**_retrain_row(r), "dag_run_id": r["dag_run_id"]} for r in retrains],
        "champion_version": trained[-1].get("champion_version") if trained else None,
        "dag_runs": runs,
        "phases": {"history": first, "one_more_day": second},
        "scoring": scoring,
        "drift_drill": drill,
        "arrival_to_model": arrival,
        "seconds_per_stage": seconds,
        "run_seconds_per_stage": {STAGE_OF[d]: t["run_seconds"] for d, t in timings.items()},
        "seconds": time.perf_counter() - started,
        "airflow_url": stack.airflow_url,
        "mlflow_url": stack.mlflow_url,
        "stack": "stopped" if stop else "up",
    }


def _score_if_champion(settings: Settings, day: date, console: Console, clock: StageClock) -> list[dict]:
    from training.registry import ModelRegistry

    console.rule(f"scoring: {day} replayed through the scoring service")
    if ModelRegistry(settings.mlflow_tracking_uri).champion() is None:
        console.print("no champion yet (no model passed the gate): nothing to score with")
        return []
    return [clock.run("scoring", lambda: score_day(settings, day, console))]


def _monitor_scored_day(api, day: date, console: Console, deadline: float) -> tuple[str, dict]:
    """Post the scoring log's event for `day` (what an operator's job does once a day's traffic is logged),
    wait for the monitoring run it starts and return (its run id, its check of the day)."""
    from orchestration.assets import SCORING_LOG

    asset_id, event_id = api.post_asset_event(SCORING_LOG.uri, {"event_dates": [day.isoformat()]})
    [created] = api.wait_for_event_runs(asset_id, event_id, deadline)
    _finished_ok(api, MONITOR, created.run_id, deadline)
    checked = api.xcom(MONITOR, created.run_id, "check")
    [check] = [c for c in checked["checks"] if c["day"] == day.isoformat()]
    console.print(f"{MONITOR} {day}: {check['summary']}")
    return created.run_id, check


def _drift_drill(
    api, settings: Settings, day: date, console: Console, clock: StageClock, deadline: float
) -> dict:
    """Monitoring at work (see run_through_airflow): a drifted copy of the day scored (beside the day's own
    scored traffic in the scoring log), the scoring log's event posted, the check's verdict, and the retrain
    its fraud_drift event started, with the reason that run recorded. Returns them."""
    console.rule("monitoring: the population shifts, a drifted copy of the day is scored and checked")
    api.unpause(MONITOR)
    drifted = clock.run("scoring", lambda: score_day(settings, day, console, drift=True))
    monitor_run, shifted = _monitor_scored_day(api, day, console, deadline)
    retrain: dict = {}
    if shifted["verdict"] == "drift":
        [started] = api.wait_for_created_runs(MONITOR, monitor_run, "fraud_drift", deadline)
        run = _finished_ok(api, RETRAIN, started.run_id, deadline)
        record = _retrain_record(api, started.run_id)
        reason = api.xcom(RETRAIN, started.run_id, "as_of_date", key="start_reason")
        retrain = {**_retrain_row(record), "dag_run_id": started.run_id, "start_reason": reason["reason"]}
        outcome = (
            f"skipped, {record['reason']}"
            if record["decision"] == "skipped"
            else f"model {record.get('model_version')} {record['decision']}"
        )
        console.print(f"{RETRAIN} started by drift ({reason['reason']}): {outcome} in {run.duration:.0f}s")
    else:
        console.print(f"[yellow]the drifted day did not cross the drift thresholds: {shifted['summary']}[/]")
    return {
        "drifted_scoring": drifted,
        "drifted_check": {k: shifted[k] for k in ("day", "verdict", "summary", "feature_source")},
        "retrain": retrain,
    }


def score_day(settings: Settings, day: date, console: Console, drift: bool = False) -> dict:
    """Replay `day` through a scoring service started with its live state taking over at the day's start
    (serving/replay.py): every transaction of the day scored in event-time order, the day's chargebacks fed
    between them. With `drift`, the transactions are shifted as the generator's `drift` fault shifts rows
    (the population changed). Returns the figures printed."""
    import os
    import socket

    import httpx

    from core.settings import settings_as_env
    from serving.replay import day_events, drifted, replay_day, replay_service

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, **settings_as_env(settings, include_secrets=True)}
    log = settings.home / "run" / f"serving-replay-{day.isoformat()}{'-drift' if drift else ''}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    events = day_events(settings, day)
    with replay_service(env, day, port, log) as service:
        report = replay_day(service, settings, day, events=drifted(events) if drift else events)
        status = httpx.get(f"{service.url}/status", headers=service.headers("read"), timeout=10).json()
    latency = report.percentiles()
    declined = sum(r["decision"] == "decline" for r in report.results)
    unknown = sum(bool(r["missing_entities"]) for r in report.results)
    shadow = f"v{status['shadow']}" if status["shadow"] else "none"
    console.print(
        f"scored {day}{' (drifted: amounts x2.5, all online)' if drift else ''} through the scoring service: "
        f"{report.transactions} transactions one request at a time in event-time order, {report.chargebacks} "
        f"chargebacks fed between them; latency p50 {latency.get('p50', 0):.2f} ms, p99 "
        f"{latency.get('p99', 0):.2f} ms (client side); {declined} declined; {unknown} with an entity never "
        f"seen before; champion v{status['champion']}, shadow {shadow}"
    )
    return {
        "date": day.isoformat(),
        "drifted": drift,
        "transactions": report.transactions,
        "chargebacks": report.chargebacks,
        "latency_ms": latency,
        "declined": declined,
        "unknown_entities": unknown,
        "champion": status["champion"],
        "shadow": status["shadow"],
        "seconds": report.seconds,
    }


def _wait_for_dags(api, deadline: float, console: Console) -> None:
    """The dag-processor has parsed every DAG file (asset schedules are known only then), without errors."""
    from mlops.airflow_api import wait_until

    def parsed() -> bool:
        errors = api.import_errors()
        if errors:
            details = "\n".join(f"{e.filename}:\n{e.stack_trace[-1500:]}" for e in errors)
            raise DemoError(f"Airflow cannot import these DAG files; fix them and run again:\n{details}")
        return set(DAG_IDS) <= api.dag_ids()

    console.print("waiting for the dag-processor to parse dags/ ...")
    wait_until(parsed, deadline, f"the DAGs {', '.join(DAG_IDS)} to be parsed", api.on_poll)


def _refuse_replay(api, settings: Settings, dates: list[date]) -> None:
    from mlops.airflow_api import midnight

    existing = api.dag_runs(INGEST, logical_date_gte=midnight(dates[0]), logical_date_lte=midnight(dates[-1]))
    if existing:
        taken = sorted({run.logical_date.date().isoformat() for run in existing})
        raise DemoError(
            f"MLOPS_HOME={settings.home} already has {INGEST} runs for {', '.join(taken)}; the demo replays "
            "its dates from the start. Use a fresh home (`make down`, then `rm -rf var` or set MLOPS_HOME "
            "to an empty folder) or later dates (--start)."
        )


def _backfill_runs(api, dates: list[date], deadline: float) -> dict[date, str]:
    """The backfill's run of each date (the API creates them with the backfill; read them back)."""
    from mlops.airflow_api import midnight, wait_until

    def created() -> dict[date, str] | None:
        runs = api.dag_runs(
            INGEST,
            run_type=["backfill"],
            logical_date_gte=midnight(dates[0]),
            logical_date_lte=midnight(dates[-1]),
        )
        by_date = {run.logical_date.date(): run.dag_run_id for run in runs}
        return by_date if set(by_date) >= set(dates) else None

    return wait_until(created, deadline, f"the backfill of {INGEST} to create its runs", api.on_poll)


def _follow_chain(
    api,
    ingest_run_ids: list[str],
    deadline: float,
    console: Console,
    after_date: Callable[[int], None] | None = None,
) -> dict[str, list[str]]:
    """Wait for each ingest run, the features runs its silver event started and the retrain runs their
    events started (created: the scheduler consumed the event); then `after_date(index)`, then the next
    ingest run. Every run must succeed. Returns the run ids per DAG, oldest first."""
    features: list[str] = []
    retrain: list[str] = []
    for index, run_id in enumerate(ingest_run_ids):
        run = _finished_ok(api, INGEST, run_id, deadline)
        arrived = api.task_instance(INGEST, run_id, SENSOR_TASK).end_date
        seconds = (run.end_date - arrived).total_seconds()
        console.print(
            f"{INGEST} {run.logical_date.date()}: {run.state.value} in {seconds:.0f}s "
            "(from its sensor seeing the arrival)"
        )
        started = [
            r.run_id for r in api.wait_for_created_runs(INGEST, run_id, "silver_transactions", deadline)
        ]
        for features_run in (r for r in dict.fromkeys(started) if r not in features):
            features.append(features_run)
            run = _finished_ok(api, FEATURES, features_run, deadline)
            dates = api.xcom(FEATURES, features_run, "plan_gold")
            console.print(f"{FEATURES} {', '.join(dates)}: {run.state.value} in {run.duration:.0f}s")
            for created in api.wait_for_created_runs(FEATURES, features_run, "fraud_features", deadline):
                if created.run_id not in retrain:
                    retrain.append(created.run_id)
        if after_date:
            after_date(index)
    for run_id in retrain:
        run = _finished_ok(api, RETRAIN, run_id, deadline)
        record = _retrain_record(api, run_id)
        outcome = record["decision"] if record["decision"] == "skipped" else (
            f"model {record['model_version']} {record['decision']}"
        )  # fmt: skip
        console.print(f"{RETRAIN} as of {record['as_of']}: {outcome} in {run.duration:.0f}s")
    return {FEATURES: features, RETRAIN: retrain}


def _finished_ok(api, dag_id: str, run_id: str, deadline: float):
    """The run (the client's DAGRunResponse) once it succeeded; a failed run names its failed tasks."""
    run = api.wait_for_run(dag_id, run_id, deadline)
    if run.state != "success":
        failed = [_task_label(ti) for ti in api.task_instances(dag_id, run_id) if ti.state == "failed"]
        where = f"task {', '.join(failed)}" if failed else "a task"
        raise DemoError(
            f"{dag_id} run {run_id} {run.state.value} at {where}; read its log in the Airflow UI "
            f"({api.base_url}/dags/{dag_id}) or under $MLOPS_HOME/airflow/logs/dag_id={dag_id}/"
        )
    return run


def _task_label(ti) -> str:
    """A task instance as the Airflow UI names it: `build_gold[2026-01-02]` for a mapped one."""
    if ti.map_index < 0:
        return ti.task_id
    return f"{ti.task_id}[{ti.rendered_map_index or ti.map_index}]"


def _features_by_date(api, run_id: str) -> dict[str, dict]:
    """A features run's gold rows, dataset revision and online rows per date. build_gold and materialize
    are mapped over the event dates plan_gold listed (map index i computed plan_gold[i]) and return one
    dict each; version_gold returns one dict per date, in the same order."""
    dates = api.xcom(FEATURES, run_id, "plan_gold")
    versions = api.xcom(FEATURES, run_id, "version_gold")
    return {
        day: {
            **api.xcom(FEATURES, run_id, "build_gold", map_index=index),
            **version,
            **api.xcom(FEATURES, run_id, "materialize", map_index=index),
        }
        for index, (day, version) in enumerate(zip(dates, versions, strict=True))
    }


def _daily_rows(api, runs: dict[str, list[str]]) -> list[dict]:
    """One row per arrival date: the ingest run's counts and the features run's gold, revision and rows."""
    built: dict[str, dict] = {}
    for run_id in runs[FEATURES]:
        built.update(_features_by_date(api, run_id))
    daily = []
    for run_id in runs[INGEST]:
        silver = api.xcom(INGEST, run_id, "build_silver")
        day = silver["arrival_date"]
        gold = built[day]
        gold["rows_gold"] = gold["rows_customer_features"] + gold["rows_merchant_features"]
        daily.append({"date": day, **_day_row(silver, gold)})
    return daily


def _retrain_record(api, run_id: str) -> dict:
    """What a retrain run decided, from its XComs; a run with nothing to train on says why it skipped."""
    as_of = api.xcom(RETRAIN, run_id, "as_of_date")
    if api.task_instance(RETRAIN, run_id, "training_set").state == "skipped":
        reason = api.xcom(RETRAIN, run_id, "training_set", key="skipped")
        return {
            "as_of": as_of,
            "decision": "skipped",
            "reason": reason,
            "status": "skipped",
            "dag_run_id": run_id,
        }
    built = api.xcom(RETRAIN, run_id, "training_set")
    if api.task_instance(RETRAIN, run_id, "skip_identical").state == "skipped":  # trained from the same
        return {
            "as_of": as_of,
            "training_set_rev": built["training_set_rev"],
            "decision": "skipped",
            "reason": api.xcom(RETRAIN, run_id, "skip_identical", key="skipped"),
            "status": "skipped",
            "dag_run_id": run_id,
        }
    trained = api.xcom(RETRAIN, run_id, "train")
    decision = api.xcom(RETRAIN, run_id, "promote")
    return {
        "as_of": as_of,
        "training_set_rev": built["training_set_rev"],
        "run_id": trained["run_id"],
        **decision,
        "status": "ok",
        "dag_run_id": run_id,
    }


def _run_timings(api, dag_id: str, run_ids: list[str]) -> dict:
    """Seconds of task work (the arrival sensor's wait left out; every map index of a mapped task counted)
    and of whole runs, summed over the runs."""
    task_seconds = run_seconds = 0.0
    for run_id in run_ids:
        run_seconds += api.dag_run(dag_id, run_id).duration or 0.0
        for ti in api.task_instances(dag_id, run_id):
            if ti.task_id != SENSOR_TASK:
                task_seconds += ti.duration or 0.0
    return {"runs": len(run_ids), "task_seconds": task_seconds, "run_seconds": run_seconds}


def _arrival_to_model(api, runs: dict[str, list[str]], arrived: datetime) -> dict:
    """From the last day's arrival (its _SUCCESS marker) to the end of the retrain run it started: wall
    seconds, the seconds when at least one task of the chain was running (the union of their intervals: the
    sensor's wait is not work), and the rest, Airflow's orchestration overhead (sensor latency, scheduling,
    task start-up outside the tasks' own time). Stage seconds are the sums of task durations per DAG; a
    mapped task's seconds are summed over its map indexes."""
    intervals: list[tuple[datetime, datetime]] = []
    stages: dict[str, float] = {}
    tasks: dict[str, float] = {}
    ends: list[datetime] = []
    for dag_id, run_ids in runs.items():
        for run_id in run_ids:
            ends.append(api.dag_run(dag_id, run_id).end_date)
            for ti in api.task_instances(dag_id, run_id):
                if ti.task_id == SENSOR_TASK or not ti.start_date or not ti.end_date:
                    continue
                intervals.append((ti.start_date, ti.end_date))
                seconds = (ti.end_date - ti.start_date).total_seconds()
                stages[STAGE_OF[dag_id]] = stages.get(STAGE_OF[dag_id], 0.0) + seconds
                tasks[f"{dag_id}.{ti.task_id}"] = tasks.get(f"{dag_id}.{ti.task_id}", 0.0) + seconds
    busy = 0.0
    reach: datetime | None = None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            busy += (end - start).total_seconds()
            reach = end
        elif end > reach:
            busy += (end - reach).total_seconds()
            reach = end
    wall = (max(ends) - arrived).total_seconds()
    return {
        "seconds": wall,
        "busy_seconds": busy,
        "overhead_seconds": wall - busy,
        "overhead_share": (wall - busy) / wall if wall > 0 else 0.0,
        "task_seconds_per_stage": stages,
        "seconds_per_task": tasks,
    }


def _airflow_stage_table(local: dict[str, float], timings: dict[str, dict]) -> Table:
    table = Table(
        "stage", "runs", "task seconds", "run seconds",
        title="time per stage (task seconds: sum of task durations; run seconds: sum of DAG run durations)",
    )  # fmt: skip
    for stage, seconds in local.items():
        table.add_row(f"{stage} (this process)", "-", f"{seconds:.1f}", "-")
    for dag_id, timing in timings.items():
        table.add_row(
            f"{STAGE_OF[dag_id]} ({dag_id})",
            str(timing["runs"]),
            f"{timing['task_seconds']:.1f}",
            f"{timing['run_seconds']:.1f}",
        )
    return table


def _other_runs(api, runs: dict[str, list[str]]) -> list[str]:
    """Runs the DAGs' own schedules made meanwhile (a daily ingest for yesterday, the weekly retrain):
    named, so that they are not mistaken for the demo's."""
    ours = {run_id for run_ids in runs.values() for run_id in run_ids}
    lines = []
    for dag_id in (INGEST, RETRAIN):
        for run in api.dag_runs(dag_id, run_type=["scheduled"]):
            if run.dag_run_id not in ours:
                lines.append(
                    f"not the demo's: {dag_id} run {run.dag_run_id} ({run.state.value}), made by the DAG's "
                    "own schedule for the current date rather than the demo's"
                )
    return lines


def _data_summary(settings: Settings, manifests: list[dict], daily: list[dict]) -> dict:
    """What both demo modes report of the data: landed, ingested, versioned and materialized rows."""
    return {
        "landing": str(settings.landing),
        "dates": [m["arrival_date"] for m in manifests],
        "rows_written": sum(m["transactions"]["rows_written"] for m in manifests),
        "rows_silver": sum(d["rows_silver"] for d in daily),
        "rows_quarantined": sum(d["rows_quarantined"] for d in daily),
        "dataset_revs": [d["dataset_rev"] for d in daily],
        "rows_materialized": sum(d["rows_materialized"] for d in daily),
    }
