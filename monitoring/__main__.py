"""`python -m monitoring`: the monitoring check as a command, the container command of the cluster profile's
check pod (the training image carries MLflow, onnxruntime, scikit-learn and SciPy; the Airflow image none
of them). Like the training CLI it prints its result as one JSON object on the last stdout line, and in a
pod records it for the launching task (core/pod_results.py); `--xcom-path` also writes it to a file."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Annotated

import typer

from core.pod_results import emit
from core.settings import get_settings

app = typer.Typer(
    name="monitoring",
    help="Drift and live-performance checks of the fraud model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def parse_dates(dates: str) -> list[date]:
    try:
        return [date.fromisoformat(d.strip()) for d in dates.split(",") if d.strip()]
    except ValueError:
        raise typer.BadParameter(f"{dates!r}: give YYYY-MM-DD, several comma-separated") from None


@app.command()
def check(
    dates: Annotated[str, typer.Option(help="dates to check, YYYY-MM-DD, comma-separated")],
    dag_id: Annotated[str, typer.Option(help="Airflow DAG id, recorded with the results")] = "",
    dag_run_id: Annotated[str, typer.Option(help="Airflow DAG run id, recorded with the results")] = "",
    xcom_path: Annotated[Path | None, typer.Option(help="also write the result JSON to this file")] = None,
) -> None:
    """Drift against the champion's training reference, live performance, the rollback rule."""
    from monitoring.check import run_checks

    days = parse_dates(dates)
    if not days:
        raise typer.BadParameter("no date given: --dates 2026-01-10[,2026-01-11]")
    emit(run_checks(get_settings(), days, dag_id, dag_run_id), xcom_path)


@app.command()
def results(
    first: Annotated[str | None, typer.Option(help="first checked date, YYYY-MM-DD")] = None,
    last: Annotated[str | None, typer.Option(help="last checked date, YYYY-MM-DD")] = None,
) -> None:
    """The results table's rows of the checked dates, as JSON lines."""
    from monitoring.store import read_results

    frame = read_results(
        get_settings(),
        date.fromisoformat(first) if first else None,
        date.fromisoformat(last) if last else None,
    )
    for row in frame.to_dict(orient="records"):
        typer.echo(json.dumps(row, default=str))


if __name__ == "__main__":
    app()
