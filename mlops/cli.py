"""The `mlops` command. Each command is a thin shell over the same functions the Airflow tasks call.

With `--json`, the last line on stdout is one JSON object; progress and tables go to stderr.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from datetime import date, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from core.settings import get_settings

app = typer.Typer(
    name="mlops",
    help="Retrain a fraud model from arriving card transactions: generate, ingest, features, train, promote.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True)
T = TypeVar("T")
# `mlops demo` defaults: a few minutes on 2 cores through Airflow (measured: see docs/benchmarks.md).
DEMO_DAYS, DEMO_ROWS_PER_DAY, DEMO_EPOCHS = 5, 3000, 8


class Format(StrEnum):
    csv = "csv"
    json = "json"


def _emit(payload: dict, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps(payload, sort_keys=True, default=str))


def _date(value: datetime) -> date:
    return value.date()


def _step(table: dict[str, T], name: str, command: str) -> T:
    """The function `--step NAME` names, or a usage error listing the names."""
    from mlops.chain import step_of

    try:
        return step_of(table, name, command)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--step") from None


def _run_step(
    command: str, date_key: str, day: date, step: str, run: Callable[[], dict], as_json: bool
) -> dict:
    """Run a pipeline step; a data problem ends the command with exit code 1 and, with --json, a JSON
    line saying which step failed and why."""
    from core.errors import PipelineError

    try:
        return run()
    except PipelineError as exc:
        err.print(f"[red]{command} {day} failed:[/] {exc}")
        failure = {"status": "failed", date_key: day.isoformat(), "step": step, "error": type(exc).__name__}
        _emit({**failure, "message": str(exc)}, as_json)
        raise typer.Exit(code=1) from None


@app.command()
def generate(
    start: Annotated[datetime, typer.Option(formats=["%Y-%m-%d"], help="first arrival date")],
    days: Annotated[int, typer.Option(min=1, help="number of arrival dates")] = 2,
    rows_per_day: Annotated[int, typer.Option(min=0, help="transactions per day, weekly average")] = 2000,
    seed: Annotated[int, typer.Option(help="same seed and arguments give byte-identical files")] = 7,
    landing: Annotated[Path | None, typer.Option(help="landing zone; default $MLOPS_HOME/landing")] = None,
    format: Annotated[Format, typer.Option("--format", help="file format")] = Format.csv,
    faults: Annotated[
        str | None, typer.Option(help="KIND=RATE,... e.g. malformed=0.01,duplicates=0.02")
    ] = None,
    customers: Annotated[
        int | None, typer.Option(min=1, help="cardholders; default rows-per-day/2, at most 500k")
    ] = None,
    merchants: Annotated[
        int | None, typer.Option(min=20, help="merchants; default rows-per-day/20, at most 50k")
    ] = None,
    rows_per_file: Annotated[int, typer.Option(min=1, help="rows per part file")] = 1_000_000,
    feed_start: Annotated[
        datetime | None,
        typer.Option(
            formats=["%Y-%m-%d"],
            help="first date of the feed (chargebacks refer back to it); "
            "default --start. Set it to add dates to an existing feed one at a time.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Write synthetic card transactions and chargebacks, one folder per arrival date, with manifests."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from pipelines.synthetic.faults import FaultSpecError, parse_faults
    from pipelines.synthetic.landing import land_synthetic
    from pipelines.synthetic.simulate import rows_for_day

    try:
        parse_faults(faults)
    except FaultSpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--faults") from None
    target = landing or get_settings().landing
    first = _date(start)
    total = sum(rows_for_day(rows_per_day, date.fromordinal(first.toordinal() + i)) for i in range(days))
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=as_json,
    ) as progress:
        task = progress.add_task("generating", total=total)
        manifests = land_synthetic(
            get_settings(),
            start=first,
            days=days,
            rows_per_day=rows_per_day,
            seed=seed,
            fmt=format.value,
            faults=faults,
            landing=target,
            customers=customers,
            merchants=merchants,
            rows_per_file=rows_per_file,
            feed_start=_date(feed_start) if feed_start else None,
            progress=lambda n: progress.advance(task, n),
        )
    table = Table("date", "rows written", "fraud", "chargebacks", "faults", title=f"landing: {target}")
    for m in manifests:
        injected = ", ".join(f"{k}={v}" for k, v in m["faults"].items() if v) or "-"
        table.add_row(
            m["arrival_date"],
            str(m["transactions"]["rows_written"]),
            str(m["transactions"]["fraud"]),
            str(m["labels"]["rows"]),
            injected,
        )
    err.print(table)
    _emit(
        {
            "status": "ok",
            "landing": str(target),
            "dates": [m["arrival_date"] for m in manifests],
            "rows_written": sum(m["transactions"]["rows_written"] for m in manifests),
            "fraud": sum(m["transactions"]["fraud"] for m in manifests),
            "labels": sum(m["labels"]["rows"] for m in manifests),
        },
        as_json,
    )


def _run_steps(
    command: str,
    date_key: str,
    days: list[datetime],
    steps: list[tuple[str, Callable]],
    call: Callable[[Callable, date], dict],
    show: Callable[[dict, date, str], None],
    as_json: bool,
) -> None:
    """Each of `steps` for each of `days`, in the order given, in this one process (one Spark session and
    one import of GX for all: a backfill or `dvc repro` pays the start-up once). The first failure ends the
    command (exit 1, with --json its failure line); what ran before it stays done. With --json the last
    line is the step's record, or with several `{"status": "ok", "runs": [...]}` holding each in order."""
    runs = []
    for day in map(_date, days):
        for name, run in steps:
            record = _run_step(command, date_key, day, name, functools.partial(call, run, day), as_json)
            show(record, day, name)
            runs.append({date_key: day.isoformat(), "step": name, **record})
    if len(runs) == 1:
        _emit(record, as_json)
    else:
        _emit({"status": "ok", "runs": runs}, as_json)


def _ingest_table(record: dict, day: date, _step_name: str) -> None:
    table = Table("measure", "value", title=f"ingest {day}: {record.get('status')}")
    for key in ("rows_in", "rows_bronze", "rows_quarantined", "rows_silver", "duplicates_removed"):
        if key in record:
            table.add_row(key, str(record[key]))
    for reason, count in record.get("quarantined_by_reason", {}).items():
        if count:
            table.add_row(f"  quarantined: {reason}", str(count))
    err.print(table)


def _features_table(record: dict, day: date, step: str) -> None:
    table = Table("measure", "value", title=f"features {day}: {record.get('status', step)}")
    for key in ("rows_customer_features", "rows_merchant_features", "dataset_rev", "rows_materialized"):
        if key in record:
            table.add_row(key, str(record[key]))
    err.print(table)


_REPEAT = "; repeat it for several, run in the order given in one process"


@app.command()
def ingest(
    days: Annotated[
        list[datetime], typer.Option("--date", formats=["%Y-%m-%d"], help=f"arrival date to ingest{_REPEAT}")
    ],
    steps: Annotated[
        list[str] | None,
        typer.Option(
            "--step",
            help="one step: ingest_to_bronze, validate_bronze, build_silver, validate_silver, ingest_labels "
            f"(default: ingest, all of them){_REPEAT}",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Landing -> bronze + quarantine -> GX -> silver -> GX for arrival dates, with reconciliation."""
    from mlops.chain import INGEST_STEPS, cli_run_id

    chosen = [(name, _step(INGEST_STEPS, name, "ingest")) for name in steps or ["ingest"]]
    settings = get_settings()
    settings.ensure_dirs()
    _run_steps(
        "ingest",
        "arrival_date",
        days,
        chosen,
        lambda run, day: run(settings, day, cli_run_id()),
        _ingest_table,
        as_json,
    )


features_app = typer.Typer(
    help="Silver -> gold features -> GX -> DVC version -> Feast online store, for event dates (`--date`); "
    "`list` and `check`: the declared features and the versions that take them.",
    add_completion=False,
)
app.add_typer(features_app, name="features")


@features_app.callback(invoke_without_command=True)
def features(
    ctx: typer.Context,
    days: Annotated[
        list[datetime] | None,
        typer.Option("--date", formats=["%Y-%m-%d"], help=f"event date to compute{_REPEAT}"),
    ] = None,
    steps: Annotated[
        list[str] | None,
        typer.Option(
            "--step",
            help="one step: plan_gold, build_gold, validate_gold, version_gold, materialize, "
            f"build_training_rows (default: features, the DAG's steps){_REPEAT}",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Silver -> gold features -> GX -> DVC version -> Feast online store, for event dates. A date built
    for other declarations is built again (the backfill of an added feature, oldest first)."""
    if ctx.invoked_subcommand is not None:
        return
    if not days:
        raise typer.BadParameter("give the event dates to compute with --date (or run `mlops features list`)")
    from mlops.chain import FEATURES_STEPS

    chosen = [(name, _step(FEATURES_STEPS, name, "features")) for name in steps or ["features"]]
    settings = get_settings()
    settings.ensure_dirs()
    _run_steps(
        "features", "event_date", days, chosen, lambda run, day: run(settings, day), _features_table, as_json
    )


@features_app.command("backfill")
def features_backfill(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Rebuild every gold date that is not up to date, with no date to name: those built for other
    declarations (after a feature is added or changed) and those whose inputs changed, oldest first, each
    through gold, GX, DVC and the online store, then their training rows. One line per date as it ends."""
    from mlops.chain import backfill

    settings = get_settings()
    settings.ensure_dirs()

    def progress(number: int, total: int, day: date, why: str, record: dict) -> None:
        err.print(
            f"backfill {number}/{total}: {day} rebuilt ({why}): "
            f"{record.get('rows_customer_features', 0)} customer rows, "
            f"{record.get('rows_merchant_features', 0)} merchant rows",
            soft_wrap=True,  # one line a date, whatever the terminal's width
        )

    from core.errors import PipelineError

    try:
        record = backfill(settings, progress)
    except PipelineError as exc:  # the dates before the failed one stay rebuilt
        err.print(f"[red]features backfill failed:[/] {exc}")
        failure = {"status": "failed", "step": "backfill", "error": type(exc).__name__, "message": str(exc)}
        _emit(failure, as_json)
        raise typer.Exit(code=1) from None
    if not record["rebuilt"]:
        err.print(
            "backfill: every gold date is built for today's declarations and inputs; nothing to do",
            soft_wrap=True,
        )
    _emit(record, as_json)


@features_app.command("list")
def features_list(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Each declared feature: its declaration, the registered versions that take it (champion, shadow) and
    how far its Feast view's online rows reach."""
    from mlops.feature_catalog import catalog

    entries = catalog(get_settings())
    table = Table(
        "feature", "declared as", "type", "used by", "online until", "deprecated", title="declared features"
    )
    for entry in entries:
        f = entry.feature
        used = ", ".join(f"v{v.number}{f' ({v.role})' if v.role else ''}" for v in entry.used_by) or "-"
        table.add_row(
            f.name, f"{f.aggregation} of {f.input} over {f.window or 'the lookback'}", f.dtype, used,
            entry.online_until.isoformat() if entry.online_until else "never materialized",
            f.deprecated or "-",
        )  # fmt: skip
    err.print(table)
    _emit({"status": "ok", "features": [e.to_dict() for e in entries]}, as_json)


@features_app.command("check")
def features_check(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Refuse (exit 1) while the champion or the shadow takes an input that the declarations no longer
    have, or a declaration is one the scoring service cannot compute live (it would not start): run it
    before deploying a change to the declarations. Says, for each deprecated feature, whether a version in
    use still takes it (keep it) or none does (remove it)."""
    from mlops.feature_catalog import (
        catalog,
        deprecation_status,
        live_problems,
        registered_versions,
        removal_problems,
    )

    settings = get_settings()
    versions = registered_versions(settings.mlflow_tracking_uri)
    problems = live_problems() + removal_problems(versions)
    deprecated = deprecation_status(catalog(settings, versions))
    for line in deprecated:
        err.print(line)
    for problem in problems:
        err.print(f"[red]{problem}[/red]")
    _emit({"status": "failed" if problems else "ok", "problems": problems, "deprecated": deprecated}, as_json)
    if problems:
        raise typer.Exit(1)


def _run_training(command: str, run, as_json: bool) -> dict:
    """A training or registry command; its data and promotion errors exit 1 with a JSON failure line."""
    from core.errors import PipelineError

    try:
        return run()
    except PipelineError as exc:
        err.print(f"[red]{command} failed:[/] {exc}")
        _emit(
            {"status": "failed", "command": command, "error": type(exc).__name__, "message": str(exc)},
            as_json,
        )
        raise typer.Exit(code=1) from None


def _decision_table(record: dict, title: str) -> None:
    table = Table("measure", "value", title=title)
    for key in ("model_version", "decision", "reason", "champion_version", "previous_champion", "auc_pr",
                "champion_auc_pr", "training_set_rev", "run_id"):  # fmt: skip
        if record.get(key) is not None:
            value = record[key]
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    err.print(table)


@app.command()
def retrain(
    day: Annotated[
        datetime, typer.Option("--date", formats=["%Y-%m-%d"], help="as-of date of the training set")
    ],
    training_set_rev: Annotated[
        str | None, typer.Option(help="train on this DVC revision instead of building the set")
    ] = None,
    window_days: Annotated[
        int | None, typer.Option(min=1, help="days of arrivals in the training set")
    ] = None,
    epochs: Annotated[int | None, typer.Option(min=1)] = None,
    batch_size: Annotated[int | None, typer.Option(min=1)] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    force: Annotated[
        bool,
        typer.Option(
            help="train even when a registered version came from the same training set, code commit, "
            "configuration and image (by default such a retrain is skipped and says so)"
        ),
    ] = False,
    actor: Actor = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Training set -> train -> evaluate -> register -> gate -> ONNX export, in this process."""
    from training.steps import retrain as run_retrain
    from training.tuning import train_config

    settings = get_settings()
    who = _actor(actor)
    config = train_config(settings, epochs=epochs, batch_size=batch_size, seed=seed, device=device)
    if config.tuned_from:
        err.print(
            f"hyperparameters from {config.tuned_from} (MLOPS_TUNING__USE_BEST_PARAMS=false: the settings')"
        )
    record = _run_training(
        "retrain",
        lambda: run_retrain(
            settings, _date(day), config, window_days, training_set_rev, force=force, actor=who
        ),
        as_json,
    )
    _decision_table(record, f"retrain as of {_date(day)}: {record.get('status')}")
    _emit(_asking_approval(settings, record, who), as_json)


def _asking_approval(settings, record: dict, started_by: str | None) -> dict:
    """A gate pass that waits for a person starts the approval run (mlops/approval_request.py); the record
    says which run, or why none was started and what to do. The decision itself is recorded either way."""
    if record.get("decision") != "awaiting_approval":
        return record
    from mlops.airflow_api import AirflowAPIError
    from mlops.approval_request import NoAirflowError, ask

    try:
        return {**record, "approval_run": ask(settings, record, started_by, err.print)}
    except (NoAirflowError, AirflowAPIError, TimeoutError) as exc:
        err.print(f"[yellow]no approval run started:[/] {exc}")
        return {**record, "approval_run": None, "approval_request": str(exc)}


# Who moves the champion: recorded on the history's row (`decided_by`) of every promotion and rollback.
Actor = Annotated[
    str | None,
    typer.Option(
        help="who you are, recorded in the promotion history with the decision (default: this machine's "
        "user name, as the command says)"
    ),
]


MAX_ACTOR = 250  # training/ledger.py: decided_by is a String(250)


def _actor(actor: str | None) -> str:
    """The actor a command records: `--actor`, else the OS user, said on stderr either way."""
    import getpass

    if actor is not None and actor.strip():
        chosen, source = actor.strip(), "--actor"
        if len(chosen) > MAX_ACTOR or not chosen.isprintable():
            raise typer.BadParameter(
                f"a name of at most {MAX_ACTOR} printable characters (the promotion history's decided_by)",
                param_hint="--actor",
            )
    else:
        try:
            chosen = getpass.getuser()
        except (KeyError, OSError):  # a uid with no name (a container's arbitrary user)
            raise typer.BadParameter(
                "this machine's user has no name; say who you are with --actor", param_hint="--actor"
            ) from None
        source = "this machine's user; --actor names another"
    err.print(f"actor: {chosen} ({source})", soft_wrap=True)
    return chosen


# The champion a promotion or rollback was decided for: refused, and nothing moves, if it is another by then.
Expect = Annotated[
    str | None,
    typer.Option(
        help="the champion version you decided this for: refused, and nothing moves, if it is another "
        "one by then (compare-and-swap)"
    ),
]


@app.command()
def promote(
    version: Annotated[str, typer.Option(help="model version of fraud-detector")],
    reason: Annotated[str, typer.Option(help="why; kept in the promotion history")] = "",
    gate: Annotated[
        bool, typer.Option(help="put the version through the gate instead of promoting it")
    ] = False,
    expect: Expect = None,
    actor: Actor = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Make a version the champion by hand (recorded with its reason and who you are), or put it through
    the gate."""
    from training import steps

    settings = get_settings()
    who = _actor(actor)
    if gate:
        record = _run_training(
            "promote", lambda: steps.promote(settings, version, actor=who, triggered_by=who), as_json
        )
    else:
        record = _run_training(
            "promote", lambda: steps.promote_by_hand(settings, version, reason, expect, who), as_json
        )
    _decision_table(record, f"promote v{version}: {record['decision']}")
    _emit(_asking_approval(settings, record, who), as_json)


@app.command("ask-approval")
def ask_approval(
    version: Annotated[str, typer.Option(help="the version whose gate pass waits for approval")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Start the approval run of a gate pass that waits for a person, in this installation's Airflow (what
    `mlops retrain` does itself when Airflow runs)."""
    from orchestration.approval import pending_candidate

    settings = get_settings()
    asked = pending_candidate(settings, version)
    if asked is None:
        err.print(f"[red]v{version} has no gate pass waiting for approval[/] (see `mlops history`)")
        _emit({"status": "failed", "message": f"v{version} has no gate pass waiting"}, as_json)
        raise typer.Exit(code=1)
    record = {
        "decision": "awaiting_approval",
        "model_version": version,
        "previous_champion": asked["champion_version"],
        "history_id": asked["history_id"],
    }
    result = _asking_approval(settings, record, asked["triggered_by"])
    _emit(result, as_json)
    if result.get("approval_run") is None:
        raise typer.Exit(code=1)


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="address to listen on (default: serving.host)")] = None,
    port: Annotated[int | None, typer.Option(help="port (default: serving.port)")] = None,
    live_from: Annotated[
        datetime | None,
        typer.Option(
            help="UTC time the live entity state takes over from the lake's history (default: now); "
            "set it to replay a past day"
        ),
    ] = None,
) -> None:
    """Run the scoring service: POST /score, the Open Inference Protocol under /v2, docs at /docs."""
    import os
    from datetime import UTC

    # Arrow reads its allocator once, when it loads: the system's, so that what the live state's load frees
    # goes back to the system (features.live.release_freed_memory). Set before anything imports pyarrow.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    import uvicorn

    from serving.app import create_app

    settings = get_settings()
    start = None if live_from is None else live_from.replace(tzinfo=live_from.tzinfo or UTC)
    listen_host = host or settings.serving.host
    listen_port = port or settings.serving.port
    from serving.auth import tokens_path

    application = create_app(settings, start)  # generates the local profile's tokens file where missing
    scheme = "https" if settings.serving.tls_cert_file else "http"
    err.print(
        f"scoring service on {scheme}://{listen_host}:{listen_port} (docs at /docs)"
        + (f"; callers' tokens in {tokens_path(settings)}" if settings.serving.auth else "; no caller checks")
    )
    tls = settings.serving
    for setting, path in (("tls_cert_file", tls.tls_cert_file), ("tls_key_file", tls.tls_key_file)):
        if path is not None and not path.is_file():
            err.print(f"[red]no file at {path}[/] (serving.{setting}): the service would not start its TLS")
            raise typer.Exit(code=2)
    uvicorn.run(
        application,
        host=listen_host,
        port=listen_port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
        ssl_certfile=str(tls.tls_cert_file) if tls.tls_cert_file else None,
        ssl_keyfile=str(tls.tls_key_file) if tls.tls_key_file else None,
    )


@app.command()
def score(
    day: Annotated[
        datetime, typer.Option("--date", formats=["%Y-%m-%d"], help="the day whose transactions to score")
    ],
    version: Annotated[
        str | None, typer.Option(help="a registered version to score with (default: the champion)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Batch scoring: score a day's transactions as the scoring service would have that day (its live state
    from the lake as of the day's start, the day's transactions and chargebacks in event-time order), and
    write the decisions to lake/decisions/date=DAY/vVERSION.parquet (docs/serving.md)."""
    from dataclasses import asdict

    from core.errors import PipelineError
    from serving.batch import score_day
    from serving.models import ModelUnavailableError

    try:
        report = score_day(get_settings(), _date(day), version)
    except (PipelineError, ModelUnavailableError) as exc:
        err.print(f"[red]score {_date(day)} failed:[/] {exc}")
        _emit({"status": "failed", "date": _date(day).isoformat(), "message": str(exc)}, as_json)
        raise typer.Exit(code=1) from None
    err.print(
        f"{report.day}: {report.scored} of {report.transactions} transactions scored with "
        f"v{report.model_version} ({report.declined} declined, {report.refused} refused as too late for "
        "their entities' history), "
        f"{report.chargebacks} chargebacks fed; decisions in {report.path}"
    )
    _emit({"status": "ok", **asdict(report)}, as_json)


@app.command()
def rollback(
    reason: Annotated[str, typer.Option(help="why; kept in the promotion history")] = "rollback",
    expect: Expect = None,
    actor: Actor = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Put the previous champion back (the rollback is itself recorded, with who you are)."""
    from training import steps

    who = _actor(actor)
    record = _run_training(
        "rollback", lambda: steps.rollback(get_settings(), reason, expect, actor=who), as_json
    )
    _decision_table(record, "rollback")
    _emit(record, as_json)


@app.command()
def history(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Every gate decision, promotion and rollback of fraud-detector, oldest first, with who made it; and
    whether MLflow's champion alias points where the history put it (`alias.out_of_band` in the JSON)."""
    from training import steps

    record = steps.history(get_settings(), alias=True)
    table = Table(
        "#", "when", "action", "decision", "candidate", "champion", "AUC-PR", "actor", "reason",
        title="promotions",
    )  # fmt: skip
    for row in record["history"]:
        score = row["candidate_metrics"].get("auc_pr")
        table.add_row(
            str(row["id"]), row["recorded_at"], row["action"], row["decision"], str(row["candidate_version"]),
            f"{row['champion_before']} -> {row['champion_after']}", "" if score is None else f"{score:.4f}",
            row["decided_by"] or "", row["reason"],
        )  # fmt: skip
    err.print(table)
    if record["alias"]["out_of_band"]:
        from training.registry import alias_mismatch

        err.print(
            f"[red]out of band:[/] {alias_mismatch(record['alias'])} (the next promote, rollback or gate run "
            "finishes an interrupted one). Move it back, or record the decision with `mlops promote "
            "--version N --reason ...`.",
            soft_wrap=True,
        )
    _emit(record, as_json)


@app.command()
def erase(
    customer: Annotated[str, typer.Option(help="the customer id whose rows are removed")],
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild/--no-rebuild",
            help="rebuild gold, its DVC revisions, the online store and the training rows from what is left "
            "(the features backfill; Spark)",
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Remove a customer's rows from landing, quarantine, bronze, silver (their chargebacks too), the scoring
    log and the online store, then rebuild gold from what is left; report what went where."""
    from core.errors import PipelineError
    from mlops.chain import erase as erase_through
    from pipelines.privacy import ERASED_FROM, ErasureError

    def progress(number: int, total: int, day: date, why: str, record: dict) -> None:
        err.print(f"erase: gold {number}/{total}: {day} rebuilt ({why})", soft_wrap=True)

    try:
        record = erase_through(get_settings(), customer, rebuild, progress)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--customer") from None
    except ErasureError as exc:
        err.print(f"[red]erase failed:[/] {exc}")
        _emit({"status": "failed", "message": str(exc)}, as_json)
        raise typer.Exit(code=1) from None
    except PipelineError as exc:  # the erasure is done; the rebuild of gold stopped at a date
        message = f"erased, but gold was not rebuilt: {exc}; run `mlops features backfill` once it is fixed"
        err.print(f"[red]erase:[/] {message}")
        _emit({"status": "failed", "step": "rebuild", "message": message}, as_json)
        raise typer.Exit(code=1) from None
    title = f"erased: {record['rows_removed']} rows"
    table = Table("where", "file, partition or view", "removed", title=title)
    for layer in (*ERASED_FROM, "online_store"):
        for name, count in record[layer].items():
            table.add_row(layer, name, str(count))
    err.print(table)
    live = record["live_state"]
    forgotten = live.get("forgotten") or {}
    err.print(
        f"scoring service: {live['status']}"
        + (f" ({forgotten.get('transactions', 0)} transactions forgotten)" if forgotten else "")
        + (f": {live['why']}" if live.get("why") else ""),
        soft_wrap=True,
    )
    if record["rebuilt"]:
        err.print(f"gold rebuilt from what is left: {', '.join(record['rebuilt'])}", soft_wrap=True)
    kept = record["held_by"]
    if kept["dataset_revisions"] is None or kept["model_versions"] is None:
        err.print(f"not read: {kept['not_read']}", soft_wrap=True)
    for rev, members in (kept["dataset_revisions"] or {}).items():
        err.print(f"kept: DVC revision {rev} ({', '.join(members)}) holds them", soft_wrap=True)
    for version in kept["model_versions"] or []:
        aliases = f", {', '.join(version['aliases'])}" if version["aliases"] else ""
        err.print(
            f"kept: model version {version['version']}{aliases} was trained on {version['training_set_rev']}",
            soft_wrap=True,
        )
    held = f" (they hold the pseudonym {record['pseudonym']}, not the id)" if record["pseudonym"] else ""
    err.print(f"not reached by this command{held}: {', '.join(record['not_reached'])}")
    _emit({"status": "erased", **record}, as_json)


@app.command(name="lineage")
def lineage_command(
    version: Annotated[str, typer.Argument(help="the registered model version (fraud-detector)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the graph as one JSON line last")] = False,
) -> None:
    """The lineage graph of a model version: landing files to the version, and what it made since."""
    from mlops.lineage import describe, lineage_of

    settings = get_settings()
    try:
        graph = lineage_of(settings, version)
    except LookupError as exc:
        err.print(f"[red]lineage:[/] {exc}")
        raise typer.Exit(code=1) from None
    for line in describe(settings, graph):
        err.print(line, markup=False, highlight=False)
    _emit(graph, as_json)


@app.command()
def reproduce(
    version: Annotated[str, typer.Argument(help="the registered model version (fraud-detector)")],
    tolerance: Annotated[
        float, typer.Option(min=0.0, help="how far each holdout metric may lie from the registered one")
    ] = 0.02,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Rebuild a model version: same commit, image, training set (its DVC hash checked) and configuration,
    retrained and compared with the registered metrics. Exits 1 when it cannot or the result differs."""
    from training.reproduce import ReproduceError
    from training.reproduce import reproduce as rebuild

    try:
        record = rebuild(get_settings(), version, tolerance)
    except ReproduceError as exc:
        err.print(f"[red]reproduce refused:[/] {exc}", markup=True, highlight=False)
        _emit({"status": "refused", "model_version": version, "reason": str(exc)}, as_json)
        raise typer.Exit(code=1) from None
    data = record["training_set"]
    compared = "equal" if data["hash_equal"] else "DIFFERENT: retrained from the recorded DVC copy"
    err.print(
        f"v{version}: commit {record['git_commit'][:12]}, image {record['image']}"
        f"{' ' + record['image_digest'] if record['image_digest'] else ''}, training set "
        f"{record['training_set_rev']} as of {data['as_of']} (DVC hash {data['recorded_md5']}; rebuilt from "
        f"the lake: {data['rebuilt_md5']}, {compared}), seed "
        f"{record['config']['seed']}, hyperparameters from {record['tuning_source']}",
        markup=False,
        highlight=False,
    )
    for metric, compared in record.get("metrics", {}).items():
        err.print(
            f"  {metric}: registered {compared['registered']:.4f}, rebuilt {compared['rebuilt']:.4f} "
            f"({'within' if compared['within'] else 'BEYOND'} {tolerance})",
            markup=False,
        )
    err.print(f"{record['status']}: {record['reason']}", markup=False, highlight=False)
    _emit(record, as_json)
    if record["status"] != "reproduced":
        raise typer.Exit(code=1)


@app.command()
def retention(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Delete what every layer keeps past its retention: landing, quarantine, the scoring log, the lake and
    the training sets, DVC revisions, MLflow artifacts of versions nothing serves (what the DAG runs)."""
    from core.errors import PipelineError
    from mlops.chain import retention as retention_of_every_layer

    try:
        record = retention_of_every_layer(get_settings())
    except PipelineError as exc:
        err.print(f"[red]retention:[/] {exc}")
        _emit({"status": "failed", "message": str(exc)}, as_json)
        raise typer.Exit(code=1) from None
    objects = record["objects_removed"]
    if "not_read" in record["models"]:
        err.print(f"model artifacts: {record['models']['not_read']}", soft_wrap=True)
    err.print(
        f"newest ingested arrival {record['newest_ingested']}: removed landing {record['landing_removed']}, "
        f"quarantine {record['quarantine_removed']}, scoring log {record['scoring_log_removed']}, "
        f"lake and training sets {len(record['lake_removed'])} entries, DVC revisions "
        f"{record['revisions_removed']} ({sum(objects.values())} objects), model artifacts of versions "
        f"{record['models']['artifacts_removed']}; kept though old: "
        f"{({**record['kept'], **record['models']['kept']}) or 'none'}",
        soft_wrap=True,
    )
    _emit(record, as_json)


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """Check Java, Spark and the services of the active profile; say how to fix each problem."""
    from mlops.doctor import Status, run_checks

    settings = get_settings()
    checks = run_checks(settings)
    table = Table("check", "status", "detail", "how to fix", title=f"profile: {settings.profile.value}")
    colour = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "red"}
    for check in checks:
        table.add_row(check.name, f"[{colour[check.status]}]{check.status}[/]", check.detail, check.fix)
    err.print(table)
    failed = [c.name for c in checks if c.status is Status.FAIL]
    _emit(
        {
            "status": "fail" if failed else "ok",
            "profile": settings.profile.value,
            "failed": failed,
            "checks": [c.as_dict() for c in checks],
        },
        as_json,
    )
    if failed:
        raise typer.Exit(code=1)


@app.command("spark-connect")
def spark_connect(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="port to listen on")] = 15002,
    conf: Annotated[
        list[str] | None,
        typer.Option("--conf", help="another Spark setting, spark.<name>=<value> (repeatable)"),
    ] = None,
) -> None:
    """Run the Spark Connect server every task's Spark work goes to (MLOPS_SPARK_REMOTE): a driver on the
    settings' master with the settings' driver options. The cluster's Deployment spark-connect runs this."""
    import os
    import sys

    from pipelines.spark import connect_server_args, spark_submit

    settings = get_settings()
    try:
        args = connect_server_args(settings, host=host, port=port, extra_conf=conf or ())
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--conf") from exc
    # The pseudonym UDF's Python workers run this environment's Python (pandas, pyarrow), as a local driver's.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    err.print(f"spark-connect: sc://{host}:{port} on {settings.spark_master}")
    command = spark_submit()
    os.execv(command, [command, *args])


@app.command("alert-egress")
def alert_egress(
    any_address: Annotated[
        bool,
        typer.Option(
            "--any-address",
            help="open each channel's port to any address but the cloud metadata endpoint, instead of the "
            "addresses its host resolves to now (a relay or webhook whose addresses change)",
        ),
    ] = False,
) -> None:
    """Print the NetworkPolicies that let every pod that sends alerts reach the configured alert channels
    (`| kubectl apply -f -`): one per namespace, the channels' ports to their addresses, nothing else."""
    import yaml

    from orchestration.alert_egress import AlertEgressError, channels, egress_policies

    settings = get_settings()
    try:
        policies = egress_policies(settings.alerts, any_address=any_address)
    except AlertEgressError as exc:
        err.print(f"[red]alert-egress:[/] {exc}")
        raise typer.Exit(code=2) from exc
    if not policies:
        err.print(
            "no alert channel is configured (MLOPS_ALERTS__WEBHOOK_URL, MLOPS_ALERTS__EMAIL_TO with "
            "MLOPS_ALERTS__SMTP_HOST): nothing to admit"
        )
        return
    typer.echo(yaml.safe_dump_all(policies, sort_keys=False), nl=False)
    err.print(f"{len(policies)} NetworkPolicies for {', '.join(map(str, channels(settings.alerts)))}")


@app.command()
def tune(
    day: Annotated[
        datetime | None,
        typer.Option(
            "--date", formats=["%Y-%m-%d"], help="as-of date of the training set (default: yesterday)"
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(min=60, help="seconds to wait for the study")] = 7200.0,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """A hyperparameter study through Airflow (tune_fraud_model on the running stack, started if needed):
    trials as parallel mapped tasks; the next retrain trains with the best trial's parameters."""
    from mlops.tune import TuningRunError, print_report, tune_through_airflow

    settings = get_settings()
    settings.ensure_dirs()
    try:
        record = tune_through_airflow(settings, None if day is None else _date(day), err, timeout)
    except TuningRunError as exc:
        err.print(f"[red]tune failed:[/] {exc}")
        _emit({"status": "failed", "command": "tune", "message": str(exc)}, as_json)
        raise typer.Exit(code=1) from None
    if record["status"] == "skipped":
        err.print(f"[yellow]tune skipped:[/] {record['reason']}")
    else:
        print_report(record, err)
    _emit(record, as_json)


@app.command()
def demo(
    start: Annotated[datetime, typer.Option(formats=["%Y-%m-%d"], help="first arrival date")] = datetime(
        2026, 1, 1
    ),
    days: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"arrival dates; the last one arrives after a model exists (default {DEMO_DAYS}; with "
            "--continue 1)",
        ),
    ] = None,
    rows_per_day: Annotated[
        int, typer.Option(min=0, help="transactions per day, weekly average")
    ] = DEMO_ROWS_PER_DAY,
    seed: Annotated[int, typer.Option(help="random seed of the synthetic feed")] = 7,
    epochs: Annotated[int, typer.Option(min=1, help="training epochs per model")] = DEMO_EPOCHS,
    in_process: Annotated[
        bool, typer.Option("--in-process", help="run the stages in this process, without Airflow")
    ] = False,
    down: Annotated[
        bool, typer.Option("--down", help="stop the stack at the end (default: leave it up to look around)")
    ] = False,
    next_day: Annotated[
        bool,
        typer.Option(
            "--continue",
            help="land the next days of the feed already under MLOPS_HOME (a demo's or the end-to-end "
            "benchmark's) and run them through the chain; --start is ignored",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option(min=60, help="seconds to wait for the DAG runs before giving up")
    ] = 3600.0,
    drift_drill: Annotated[
        bool,
        typer.Option(
            help="after scoring the last day, score a drifted copy of it and follow monitoring to the "
            "retrain the drift starts (through Airflow only)"
        ),
    ] = True,
    score: Annotated[
        bool,
        typer.Option(
            help="after the chain, replay the last day through the scoring service with the champion (the "
            "end-to-end benchmark turns it off: at 1M rows a day's replay outlasts the chain)"
        ),
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON summary line last")] = False,
) -> None:
    """The whole loop on the embedded stack, through Airflow: start the stack (scripts/up.sh), land a
    synthetic feed and replay it through the DAGs (ingest -> features -> retrain, chained by their assets);
    then one more day arrives and a challenger goes through the gate. The stack stays up unless --down."""
    from mlops.airflow_api import AirflowAPIError
    from mlops.demo import DemoError, next_arrival, run_in_process, run_through_airflow
    from mlops.stack import StackError

    # wide enough for the summary tables when stderr is not a terminal (rich assumes 80 columns)
    console = Console(stderr=True, width=max(err.width, 120))
    settings = get_settings()
    first, feed_start = _date(start), None
    if next_day:
        try:
            feed_start, first = next_arrival(settings)
        except DemoError as exc:
            err.print(f"[red]demo failed:[/] {exc}")
            raise typer.Exit(code=1) from None
    days = days or (1 if next_day else DEMO_DAYS)
    if days < 2 and not next_day:
        err.print("[red]demo failed:[/] --days must be at least 2: one to train the champion, one more for a "
                  "challenger (or --continue on a home that has a champion)")  # fmt: skip
        raise typer.Exit(code=2)
    if in_process:
        summary = _run_training(
            "demo",
            lambda: run_in_process(
                settings, first, days, rows_per_day, seed, epochs, console, feed_start=feed_start, score=score
            ),
            as_json,
        )
        _emit(summary, as_json)
        return

    def through_airflow() -> dict:
        try:
            return run_through_airflow(
                settings,
                first,
                days,
                rows_per_day,
                seed,
                epochs,
                console,
                stop=down,
                timeout=timeout,
                feed_start=feed_start,
                drift_drill=drift_drill,
                score=score,
            )
        except (DemoError, StackError, AirflowAPIError, TimeoutError) as exc:
            err.print(
                f"[red]demo failed:[/] {exc}\n"
                "The stack is left as it is for a look (logs: $MLOPS_HOME/run/*.log); `make down` stops it."
            )
            _emit(
                {"status": "failed", "command": "demo", "error": type(exc).__name__, "message": str(exc)},
                as_json,
            )
            raise typer.Exit(code=1) from None

    summary = _run_training("demo", through_airflow, as_json)
    _emit(summary, as_json)


if __name__ == "__main__":
    app()
