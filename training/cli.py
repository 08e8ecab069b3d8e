"""The training CLI: the container command of the GPU pod (`python -m training train ...`) and the same
code `mlops retrain` runs. Its options map one to one onto the KubernetesPodOperator's arguments.

Every command prints its result as one JSON object on the last stdout line; `--xcom-path` also writes it
to a file. In a pod of the cluster profile the result is also recorded for the launching task to read
(core/pod_results.py: the pod's name and namespace, from the downward API, are the key).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from core.pod_results import emit
from core.settings import get_settings

app = typer.Typer(
    name="training",
    help="Build training sets, train, evaluate, register, gate and export the fraud model.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

XcomPath = Annotated[Path | None, typer.Option(help="also write the result JSON to this file")]
DagId = Annotated[str, typer.Option(help="Airflow DAG id, recorded as lineage")]
DagRunId = Annotated[str, typer.Option(help="Airflow DAG run id, recorded as lineage")]


def main() -> None:
    """Run the CLI. A PipelineError (bad data, a diverged run: no retry can fix it) ends the command with its
    message on stderr, a JSON failure line on stdout and exit status EXIT_PIPELINE_ERROR, so the launching
    task fails without retries; any other error keeps its traceback and exit status 1 (retryable)."""
    from core.errors import EXIT_PIPELINE_ERROR, PipelineError

    try:
        app()
    except PipelineError as exc:
        typer.echo(f"{type(exc).__name__}: {exc}", err=True)
        emit({"status": "failed", "error": type(exc).__name__, "message": str(exc)}, record=False)
        raise SystemExit(EXIT_PIPELINE_ERROR) from None


@app.command()
def dataset(
    date: Annotated[datetime, typer.Option(formats=["%Y-%m-%d"], help="as-of date (its end is the cutoff)")],
    window_days: Annotated[int | None, typer.Option(min=1, help="days of arrivals to use")] = None,
    xcom_path: XcomPath = None,
) -> None:
    """Build the training set (point-in-time join with fraud_model_v1) and version it with DVC."""
    from training import steps

    emit(steps.dataset(get_settings(), date.date(), window_days), xcom_path)


@app.command()
def train(
    training_set_rev: Annotated[str, typer.Option(help="DVC revision of the training set")],
    epochs: Annotated[int | None, typer.Option(min=1)] = None,
    batch_size: Annotated[int | None, typer.Option(min=1)] = None,
    learning_rate: Annotated[float | None, typer.Option(min=0.0)] = None,
    accumulation_steps: Annotated[int | None, typer.Option(min=1)] = None,
    seed: Annotated[int | None, typer.Option()] = None,
    patience: Annotated[int | None, typer.Option(min=1)] = None,
    checkpoint_every: Annotated[int | None, typer.Option(min=1, help="optimizer steps")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option(help="default $MLOPS_HOME/checkpoints/<rev>")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    precision: Annotated[str, typer.Option(help="auto | fp32 | bf16 | fp16")] = "auto",
    stop_after_steps: Annotated[int | None, typer.Option(min=1, help="drill: stop after N steps")] = None,
    training_set_seconds: Annotated[
        float | None, typer.Option(min=0.0, help="how long the training set took to build (logged)")
    ] = None,
    dag_id: DagId = "",
    dag_run_id: DagRunId = "",
    xcom_path: XcomPath = None,
) -> None:
    """Train (resuming from the checkpoint of the same arguments if there is one); log the run to MLflow."""
    from training import steps
    from training.tuning import train_config

    settings = get_settings()
    config = train_config(
        settings, epochs=epochs, batch_size=batch_size, learning_rate=learning_rate,
        accumulation_steps=accumulation_steps, seed=seed, patience=patience,
        checkpoint_every=checkpoint_every, device=device, precision=precision,
        stop_after_steps=stop_after_steps,
    )  # fmt: skip
    result = steps.train(
        settings, training_set_rev, config, checkpoint_dir, dag_id, dag_run_id, training_set_seconds
    )
    # Under torchrun only the first process reports.
    if int(os.environ.get("RANK", "0")) == 0:
        emit(result, xcom_path)


@app.command()
def identical(
    training_set_rev: Annotated[str, typer.Option(help="DVC revision of the training set")],
    dag_id: DagId = "",
    dag_run_id: DagRunId = "",
    force: Annotated[bool, typer.Option(help="train anyway (the DAG's `force` param)")] = False,
    xcom_path: XcomPath = None,
) -> None:
    """Whether a registered version was trained from the same training set, code commit, configuration and
    image as `train` would be now; exit EXIT_SKIPPED (the pod task skips, and the steps after it) when so."""
    from core.errors import EXIT_SKIPPED
    from training import steps
    from training.tuning import train_config

    if force:
        emit({"identical": None, "forced": True, "training_set_rev": training_set_rev}, xcom_path)
        return
    settings = get_settings()
    result = steps.identical(settings, training_set_rev, train_config(settings), dag_id, dag_run_id)
    emit(result, xcom_path)
    if result["identical"]:
        raise SystemExit(EXIT_SKIPPED)


@app.command()
def evaluate(run_id: Annotated[str, typer.Option(help="MLflow run id")], xcom_path: XcomPath = None) -> None:
    """Score the run's model on its holdout; log metrics and curves."""
    from training import steps

    emit(steps.evaluate(get_settings(), run_id), xcom_path)


@app.command()
def register(
    run_id: Annotated[str, typer.Option(help="MLflow run id")],
    image_id: Annotated[
        str, typer.Option(help="the image the training pod ran, as its node reported it (repo@sha256:...)")
    ] = "",
    xcom_path: XcomPath = None,
) -> None:
    """Register the run's model as a new version of fraud-detector."""
    from training import steps

    emit(steps.register(get_settings(), run_id, image_id), xcom_path)


@app.command()
def promote(
    version: Annotated[str, typer.Option(help="model version to put through the gate")],
    dag_id: DagId = "",
    dag_run_id: DagRunId = "",
    triggered_by: Annotated[str, typer.Option(help="who started the run (may not approve it)")] = "",
    require_approval: Annotated[
        bool, typer.Option(help="a pass waits for a person even when approval.enabled is off")
    ] = False,
    xcom_path: XcomPath = None,
) -> None:
    """The champion/challenger gate for one version."""
    from training import steps

    decided = steps.promote(
        get_settings(), version, dag_id, dag_run_id, triggered_by or None, require_approval
    )
    emit(decided, xcom_path)


@app.command()
def approve(
    version: Annotated[str, typer.Option(help="the version waiting for approval")],
    choice: Annotated[str, typer.Option(help="Approve | Reject | none (no answer in time)")] = "",
    decided_by: Annotated[str, typer.Option(help="who answered")] = "",
    comment: Annotated[str, typer.Option(help="what they wrote")] = "",
    started_by: Annotated[str, typer.Option(help="who started the approval run (may not approve)")] = "",
    dag_id: DagId = "",
    dag_run_id: DagRunId = "",
    xcom_path: XcomPath = None,
) -> None:
    """Record a person's answer to a gate pass waiting for approval; an approval promotes it."""
    from training import steps

    emit(
        steps.approve(
            get_settings(), version, choice or None, decided_by or None, comment, (started_by or None,),
            dag_id, dag_run_id,
        ),
        xcom_path,
    )  # fmt: skip


@app.command("trained-on")
def trained_on(
    revisions: Annotated[str, typer.Option(help="training-set DVC revisions, comma-separated")] = "",
    xcom_path: XcomPath = None,
) -> None:
    """The model versions trained on these training sets, with their aliases (an erasure's report names them:
    the erase_customer DAG's last step in the cluster, where the Airflow image cannot read the registry)."""
    from training.registry import ModelRegistry

    wanted = {r.strip() for r in revisions.split(",") if r.strip()}
    for revision in wanted:
        if not revision.isalnum():
            raise typer.BadParameter(f"{revision!r} is not a DVC revision", param_hint="--revisions")
    found = ModelRegistry(get_settings().mlflow_tracking_uri).trained_on(wanted) if wanted else []
    emit({"revisions": sorted(wanted), "model_versions": found}, xcom_path)


@app.command("retention-models")
def retention_models(
    newest: Annotated[
        str, typer.Option(help="the newest arrival ingested, counted back from (YYYY-MM-DD; empty: none yet)")
    ] = "",
    xcom_path: XcomPath = None,
) -> None:
    """The models' part of the retention run (the cluster's enforce_retention DAG): the training sets of the
    versions that may serve again, which the datasets' retention keeps, and the expired versions' artifacts
    deleted."""
    from datetime import date

    from training.retention import models_retention

    try:
        since = date.fromisoformat(newest) if newest else None
    except ValueError:
        raise typer.BadParameter(f"{newest!r} is not a date (YYYY-MM-DD)", param_hint="--newest") from None
    emit(models_retention(get_settings(), since), xcom_path)


@app.command("resolve-image")
def resolve_image(
    version: Annotated[str, typer.Option(help="the registered version to reproduce")],
    xcom_path: XcomPath = None,
) -> None:
    """The image a version was trained in, by digest, and the tag it recorded: what its reproduce pod runs."""
    from training.reproduce import image_by_digest, resolve

    made = resolve(get_settings(), version)
    record = {"model_version": version, "image": image_by_digest(made), "image_tag": made["image"]}
    emit(
        {**record, "git_commit": made["git_commit"], "training_set_rev": made["training_set_rev"]}, xcom_path
    )


@app.command()
def reproduce(
    version: Annotated[str, typer.Option(help="the registered version to rebuild")],
    tolerance: Annotated[float, typer.Option(min=0.0, help="how far each holdout metric may lie")] = 0.02,
    image: Annotated[
        str, typer.Option(help="the image tag the version recorded (this pod runs it by digest)")
    ] = "",
    xcom_path: XcomPath = None,
) -> None:
    """Rebuild a version in the image it was trained in (`mlops reproduce`'s work, in a pod): its training
    set checked against the lake, retrained and compared. Fails unless it is reproduced."""
    from core.errors import PipelineError
    from training.reproduce import reproduce as rebuild

    settings = get_settings()
    if image:  # the identity check compares the image the version recorded, which this pod runs by digest
        settings = settings.model_copy(
            update={"training": settings.training.model_copy(update={"image": image})}
        )
    record = rebuild(settings, version, tolerance)
    emit(record, xcom_path)
    if record["status"] != "reproduced":
        raise PipelineError(f"v{version}: {record['status']}: {record['reason']}")


@app.command()
def export(version: Annotated[str, typer.Option(help="model version")], xcom_path: XcomPath = None) -> None:
    """ONNX export (+ int8 where it pays) with a parity check."""
    from training import steps

    emit(steps.export(get_settings(), version), xcom_path)


@app.command()
def compress(
    version: Annotated[str, typer.Option(help="model version")],
    decision: Annotated[str, typer.Option(help="the gate's decision on it (promote's result)")],
    xcom_path: XcomPath = None,
) -> None:
    """The int8, pruned and student variants of a promoted version; exit EXIT_SKIPPED (the pod task skips)
    for a version the gate did not promote."""
    from core.errors import EXIT_SKIPPED
    from training import steps

    made = steps.compress(get_settings(), version, decision)
    emit(made, xcom_path)
    if made.get("skip"):
        raise SystemExit(EXIT_SKIPPED)


@app.command("tune-start")
def tune_start(
    as_of: Annotated[str, typer.Option(help="as-of date of the training set (YYYY-MM-DD): names the study")],
    training_set_rev: Annotated[str, typer.Option(help="DVC revision of the training set")],
    xcom_path: XcomPath = None,
) -> None:
    """Create (or resume) the study of a training set, with its MLflow parent run."""
    from training import tuning

    emit(tuning.start(get_settings(), as_of, training_set_rev), xcom_path)


@app.command()
def trial(
    study: Annotated[str, typer.Option(help="study name (tune-start's result)")],
    slot: Annotated[int, typer.Option(min=0, help="which trial of the study this task runs")],
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="default $MLOPS_HOME/checkpoints/tuning")
    ] = None,
    xcom_path: XcomPath = None,
) -> None:
    """One trial: train with the study's suggestion, reporting validation AUC-PR per epoch to the pruner."""
    from training import tuning

    emit(tuning.run_trial(get_settings(), study, slot, device, checkpoint_dir), xcom_path)


@app.command("tune-finish")
def tune_finish(study: Annotated[str, typer.Option(help="study name")], xcom_path: XcomPath = None) -> None:
    """Record the best trial on the study's parent run; the next retrain trains with its parameters."""
    from training import tuning

    emit(tuning.finish(get_settings(), study), xcom_path)
