"""The retraining steps, each one call for a DAG task or a CLI command:
dataset -> train -> evaluate -> register -> promote -> export, and `retrain`, all of them in turn.

Steps hand each other small values (a dataset revision, an MLflow run id, a model version), never data:
the training set travels by its DVC revision, the model through the MLflow registry. So the train step can
run in a GPU pod while the others run on an Airflow worker.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec

from core import lineage
from core.clock import StageClock
from core.settings import Settings
from model_contract import operating_point
from model_contract.onnx import CHAMPION_ALIAS, MODEL_NAME
from training.dataset import (
    MODEL_INPUTS,
    SPLIT,
    TRAINING_SET_MEMBER,
    build_training_set,
    model_arrays,
    read_holdout,
    read_training_set,
)
from training.registry import GatePolicy, ModelRegistry
from training.tracking import EXPERIMENT, Lineage, MetricBuffer, configure, git_commit, training_set_rev

if TYPE_CHECKING:
    import pandas as pd

    from training.loop import Tensors, TrainConfig

log = logging.getLogger(__name__)
P = ParamSpec("P")

MODEL_ARTIFACT = "model"
GOLD_SUITES = ("gold_customer_features", "gold_merchant_features")


STAGE_METRIC = "stage_seconds.{}"  # each step's seconds, a metric of the training run the retrain made


def log_stage_seconds(settings: Settings, run_id: str, stage: str, seconds: float) -> None:
    import mlflow

    mlflow.MlflowClient(settings.mlflow_tracking_uri).log_metric(run_id, STAGE_METRIC.format(stage), seconds)


def _timed(stage: str, run_of: Callable[[Settings, dict], str]):
    """Log how long the step took to the retrain's training run (`run_of` finds it from the step's result):
    each step logs its own, so the run holds every stage's seconds whether the steps ran in one process
    (`mlops retrain`) or as Airflow tasks and pods."""

    def wrap(step: Callable[P, dict]) -> Callable[P, dict]:
        @functools.wraps(step)
        def timed(*args: P.args, **kwargs: P.kwargs) -> dict:
            started = time.perf_counter()
            result = step(*args, **kwargs)
            settings = args[0]
            assert isinstance(settings, Settings)
            log_stage_seconds(settings, run_of(settings, result), stage, time.perf_counter() - started)
            return result

        return timed

    return wrap


def _run_of_version(settings: Settings, result: dict) -> str:
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, result["model_version"]).run_id
    assert run_id is not None, "versions are registered from training runs"
    return run_id


def split_tensors(frame: pd.DataFrame, split: str, inputs: Sequence[str] = MODEL_INPUTS) -> Tensors:
    import torch

    from training.loop import Tensors

    x, y = model_arrays(frame[frame[SPLIT] == split], inputs)
    return Tensors(torch.from_numpy(x), torch.from_numpy(y))


# --- lineage: what each step read and wrote (core/lineage.py) ---------------------------------------------


def _version(settings: Settings, version: object) -> lineage.Dataset:
    return lineage.model_version(settings, MODEL_NAME, str(version))


def _train_lineage(
    settings: Settings,
    result: dict,
    training_set_rev: str,
    config: TrainConfig,
    *args: object,
    **kwargs: object,
) -> lineage.Datasets:
    """The training set's revision -> the MLflow run; with what rebuilds it: commit, image, configuration
    (the tuned hyperparameters and the seed among it)."""
    if not result.get("run_id"):  # a torchrun worker other than rank 0: rank 0 reports the run
        return lineage.Datasets()
    return lineage.Datasets(
        [lineage.dvc_revision(settings, TRAINING_SET_MEMBER, training_set_rev)],
        [lineage.mlflow(settings, f"runs/{result['run_id']}")],
        {
            "git_commit": git_commit(),
            "image": _image(settings),
            "seed": config.seed,
            "config": asdict(config),
        },
    )


def _register_lineage(settings: Settings, result: dict, run_id: str, image_id: str = "") -> lineage.Datasets:
    return lineage.Datasets(
        [lineage.mlflow(settings, f"runs/{run_id}")], [_version(settings, result["model_version"])]
    )


def _alias_lineage(settings: Settings, record: dict, *args: object, **kwargs: object) -> lineage.Datasets:
    """A gate's, a person's or a rollback's decision: the version judged -> the champion alias, when it moved
    (the alias dataset's version names the version it points at now)."""
    versions = {record.get("model_version"), record.get("champion_version")} - {None}
    moved = record.get("champion_version") and record.get("champion_version") != record.get(
        "previous_champion"
    )
    alias = f"models/{MODEL_NAME}/aliases/{CHAMPION_ALIAS}"
    return lineage.Datasets(
        [_version(settings, v) for v in sorted(versions, key=str)],
        [lineage.mlflow(settings, alias, version=str(record["champion_version"]))] if moved else [],
        {"decision": record.get("decision"), "previous_champion": record.get("previous_champion")},
    )


def _export_lineage(settings: Settings, record: dict, version: str, *args: object) -> lineage.Datasets:
    """The version -> its ONNX files in its run's artifacts."""
    from training.export import ONNX_DIR

    files = [v["file"] for v in record.get("variants", [])]
    if not files:
        return lineage.Datasets([_version(settings, version)])
    run_id = _run_of_version(settings, {"model_version": version})
    return lineage.Datasets(
        [_version(settings, version)],
        [lineage.mlflow(settings, f"runs/{run_id}/artifacts/{ONNX_DIR}/{name}") for name in files],
        {"serving_file": record.get("serving_file")},
    )


# The first step, defined beside the training set: its Airflow task imports neither MLflow nor torch.
dataset = build_training_set


def _gold_validation(settings: Settings, as_of: str) -> tuple[str, str]:
    """The GX suites and outcome of the gold the training set was built from (written by validate_gold)."""
    import json

    from pipelines.gold.contract import validation_path

    path = validation_path(settings.lake, date.fromisoformat(as_of))
    record = json.loads(path.read_text()) if path.is_file() else None
    if record is None:
        return ",".join(GOLD_SUITES), "unknown"
    return ",".join(r["suite"] for r in record["results"]), str(all(r["success"] for r in record["results"]))


@lineage.emits("train", _train_lineage)
def train(
    settings: Settings,
    training_set_rev: str,
    config: TrainConfig,
    checkpoint_dir: Path | None = None,
    dag_id: str = "",
    dag_run_id: str = "",
    training_set_seconds: float | None = None,
) -> dict:
    """Train on the training set of `training_set_rev`; log the run and the model to MLflow (with the
    seconds the training set took to build, when given, and this step's own)."""
    started = time.perf_counter()
    import mlflow
    import torch
    from mlflow.models import infer_signature

    from features.definitions import FEATURE_SERVICE
    from training.artifacts import log_model
    from training.loop import train as fit
    from training.model import FraudMLP, ModelConfig

    frame = read_training_set(settings, training_set_rev)
    model_config = ModelConfig(hidden=tuple(config.hidden), dropout=config.dropout)
    train_data, validation = (
        split_tensors(frame, split, model_config.inputs) for split in ("train", "validation")
    )
    as_of = frame.attrs.get("as_of") or frame["event_timestamp"].max().date().isoformat()
    suites, gx_success = _gold_validation(settings, as_of)
    lineage = Lineage(
        training_set_rev=training_set_rev,
        as_of=as_of,
        feature_service=FEATURE_SERVICE,
        gx_suites=suites,
        gx_success=gx_success,
        git_commit=git_commit(),
        image=_image(settings),
        dag_id=dag_id,
        dag_run_id=dag_run_id,
        retrain_key=retrain_key(retrain_identity(settings, training_set_rev, config)) or "",
        model_inputs=json.dumps(list(model_config.inputs)),
    )
    torch.manual_seed(config.seed)
    model = FraudMLP(model_config)
    model.fit_normalization(train_data.x[:, : model_config.numeric])
    checkpoint_dir = checkpoint_dir or settings.checkpoints_dir / training_set_rev
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        # Under torchrun every process trains its share of each epoch; only rank 0 opens the MLflow run,
        # logs metrics and the model, and reports (training/cli.py).
        result = fit(model, train_data, validation, config, checkpoint_dir, training_set_rev, None)
        return {"status": "trained", "rank": rank, "optimizer_steps": result.optimizer_steps}

    experiment_id = configure(settings)
    client = mlflow.MlflowClient()
    with mlflow.start_run(
        experiment_id=experiment_id, run_name=f"train-{training_set_rev}", log_system_metrics=True
    ) as run:
        run_id = run.info.run_id
        mlflow.set_tags(
            {
                **lineage.tags(),
                "mlflow.note.content": f"fraud model trained on {training_set_rev}",
                # which hyperparameters: a study's best trial, or the training settings
                "tuning.source": config.tuned_from or "settings",
            }
        )
        mlflow.log_params(
            {
                **{f"train.{k}": v for k, v in asdict(config).items()},
                **{f"model.{k}": v for k, v in model_config.to_dict().items()},
                "data.rows_train": len(train_data),
                "data.rows_validation": len(validation),
                "data.positives_train": int(train_data.y.sum()),
                # legitimate train/validation rows kept (training/dataset.py); 1.0: none left out
                "data.negative_sample_rate": frame.attrs.get("negative_sample_rate", 1.0),
            }
        )
        metrics = MetricBuffer(client, run_id)

        def on_epoch_end(epoch: int, record: dict) -> None:
            metrics.add({k: v for k, v in record.items() if k != "epoch"}, step=epoch)
            metrics.flush()

        result = fit(model, train_data, validation, config, checkpoint_dir, training_set_rev, on_epoch_end)
        if result.interrupted:
            return {"status": "interrupted", "run_id": run_id, "optimizer_steps": result.optimizer_steps}
        model = model.to("cpu").eval()
        example = validation.x[:5].cpu()
        with torch.no_grad():
            signature = infer_signature(example.numpy(), model(example).numpy())
        # Weights and config, never a pickle (training/artifacts.py): loading a model must not run code
        # from its artifact. Not MLflow's pt2 either: it fixes the example's batch shape and drops the
        # module's config; the ONNX export is the portable scoring format.
        log_model(
            model,
            name=MODEL_ARTIFACT,
            signature=signature,
            input_example=example.numpy(),
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"],
        )
        summary = {
            "best_validation_auc_pr": result.best_validation_auc_pr,
            "best_epoch": result.best_epoch,
            "epochs_run": result.epochs_run,
            "samples_per_second": result.samples_per_second,
            "tracking_seconds": metrics.seconds_logging,
        }
        mlflow.log_metrics({k: float(v) for k, v in summary.items()})
        stages = {"train": time.perf_counter() - started}
        if training_set_seconds is not None:
            stages["training_set"] = training_set_seconds
        mlflow.log_metrics({STAGE_METRIC.format(k): v for k, v in stages.items()})
        mlflow.set_tags(
            {"device": result.device, "precision": result.precision, "world_size": result.world_size}
        )
    return {
        "status": "trained",
        "run_id": run_id,
        "training_set_rev": training_set_rev,
        "resumed_from_step": result.resumed_from_step,
        "optimizer_steps": result.optimizer_steps,
        "stopped_early": result.stopped_early,
        "device": result.device,
        "precision": result.precision,
        **summary,
    }


@_timed("evaluate", lambda settings, result: result["run_id"])
def evaluate(settings: Settings, run_id: str) -> dict:
    """Score the run's model on the holdout of its training set; log metrics and PNG curves to the run."""
    import tempfile

    import mlflow
    import torch

    from training.artifacts import load_model
    from training.loop import predict
    from training.metrics import evaluate as metrics_of
    from training.metrics import plot_evaluation

    rev = training_set_rev(settings, run_id)  # first: it points this process's MLflow at the settings' server
    model = load_model(f"runs:/{run_id}/{MODEL_ARTIFACT}")
    holdout = read_holdout(settings, rev, model.config.inputs)
    scores = predict(model, torch.from_numpy(holdout.x)).numpy()
    labels, weights = holdout.y, holdout.weights
    values = metrics_of(labels, scores, weights=weights)
    client = mlflow.MlflowClient()
    buffer = MetricBuffer(client, run_id)
    buffer.add({f"holdout_{k}": v for k, v in values.items()}, step=0)
    if "non_finite_scores" in values:  # a diverged model: NaN metrics (the gate refuses them), no plots
        buffer.flush()
        return {"run_id": run_id, "training_set_rev": holdout.rev, "holdout": values}
    # Its own threshold, for the decline rate the settings state (register copies it to the version's tags).
    point = operating_point.choose(
        labels, scores, settings.training.decline_rate, settings.training.review_rate, weights
    )
    buffer.add(point.metrics(), step=0)
    buffer.flush()
    with tempfile.TemporaryDirectory() as folder:
        for path in plot_evaluation(labels, scores, Path(folder), weights=weights):
            client.log_artifact(run_id, str(path), "evaluation")
    return {
        "run_id": run_id,
        "training_set_rev": holdout.rev,
        "holdout": values,
        "operating_point": asdict(point),
    }


def image_digest(image_id: str) -> str | None:
    """The `sha256:...` digest in a container's image id as Kubernetes reports it (`docker-pullable://repo@
    sha256:...`, `repo@sha256:...`, or `sha256:...` for an image the node has by id only); None if none."""
    digest = image_id.rsplit("@", 1)[-1].rsplit("://", 1)[-1]
    kind, _, value = digest.partition(":")
    return (
        digest
        if kind == "sha256" and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
        else None
    )


@lineage.emits("register", _register_lineage)
@_timed("register", lambda settings, result: result["run_id"])
def register(settings: Settings, run_id: str, image_id: str = "") -> dict:
    """Register the run's model as a new version of `fraud-detector`. `image_id`: the image the training
    pod ran, as its node reported it (`repository@sha256:...`, the launching task's XCom), recorded on the
    run and the version as `lineage.image_id`, with its digest as `lineage.image_digest`: the tag alone
    (`lineage.image`) can be pushed again with other contents."""
    import mlflow

    configure(settings)
    client = mlflow.MlflowClient()
    if image_id:
        client.set_tag(run_id, "lineage.image_id", image_id)
        digest = image_digest(image_id)
        if digest:
            client.set_tag(run_id, "lineage.image_digest", digest)
    run = client.get_run(run_id)
    tags = {k: v for k, v in run.data.tags.items() if k.startswith("lineage.")}
    # The threshold the evaluate step chose on the holdout: the service decides at it for this version.
    point = operating_point.from_metrics(run.data.metrics)
    if point is not None:
        tags |= point.tags()
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    version = registry.register(run_id, MODEL_ARTIFACT, tags={**tags, "run_id": run_id})
    return {"run_id": run_id, "model_version": version}


def _ledger(settings: Settings):
    from training.ledger import Ledger

    if settings.promotion_ledger_url.startswith("sqlite"):  # the cluster's is PostgreSQL: nothing to make
        settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    return Ledger(settings.promotion_ledger_url)


@_timed("promote", _run_of_version)
@lineage.emits("promote", _alias_lineage)
def promote(
    settings: Settings,
    version: str,
    dag_id: str = "",
    dag_run_id: str = "",
    triggered_by: str | None = None,
    require_approval: bool = False,
    actor: str | None = None,
) -> dict:
    """Run the gate for `version` against the champion on the holdout of the version's training set, the
    decision's actor `actor` (a command's user) or else the DAG run. With
    `approval.enabled`, or `require_approval` (a run's own request: it can ask for a sign-off the settings do
    not, never waive one they do), a pass waits for a person (`awaiting_approval`); `triggered_by` started
    the run."""
    from training.registry import promote_with_gate

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    run_id = registry.client.get_model_version(registry.name, version).run_id
    assert run_id is not None, "versions are registered from training runs"
    holdout = read_holdout(settings, training_set_rev(settings, run_id))
    policy = GatePolicy(**settings.gate.model_dump(), target_decline_rate=settings.training.decline_rate)
    ledger = _ledger(settings)
    try:
        decision = promote_with_gate(
            registry,
            ledger,
            version,
            None,
            holdout.y,
            policy,
            holdout_weights=holdout.weights,
            training_set_rev=holdout.rev,
            dag_id=dag_id or None,
            run_id=dag_run_id or None,
            require_approval=settings.approval.enabled or require_approval,
            triggered_by=triggered_by or None,
            holdout_matrix=holdout.matrix,  # each version its own inputs of the same rows
            actor=actor,
            default_threshold=settings.serving.threshold,  # a version without an operating point's
        )
        history = ledger.history(registry.name)
    finally:
        ledger.dispose()
    return {**_decision_record(decision), **_model_card(settings, registry, version, history, holdout)}


def _model_card(
    settings: Settings, registry: ModelRegistry, version: str, history: list, holdout=None
) -> dict:
    """The version's model card written (training/model_card.py): where to open it. The decision is already
    recorded: a card that cannot be written is said, never a reason to fail the step."""
    from training import model_card

    try:
        return {"model_card": model_card.write(settings, registry, version, history, holdout)}
    except Exception as exc:
        log.warning("model card of v%s not written: %s", version, exc, exc_info=True)
        return {"model_card": None, "model_card_error": f"{type(exc).__name__}: {exc}"}


def _decision_record(decision) -> dict:
    from training.metrics import PRIMARY_METRIC

    return {
        "model_version": decision.candidate_version,
        "champion_version": decision.champion_after,
        "previous_champion": decision.champion_before,
        "decision": decision.decision,
        "reason": decision.reason,
        "primary_metric": PRIMARY_METRIC,
        PRIMARY_METRIC: decision.candidate_metrics.get(PRIMARY_METRIC),
        "champion_" + PRIMARY_METRIC: decision.champion_metrics.get(PRIMARY_METRIC),
        "history_id": decision.id,
        "actor": decision.decided_by,  # who moved (or decided not to move) the champion
        # what the candidate's inputs add to and remove from the champion's (None: the same inputs)
        "inputs_change": decision.inputs_change,
    }


@lineage.emits("approve", _alias_lineage)
def approve(
    settings: Settings,
    version: str,
    choice: str | None,
    decided_by: str | None,
    comment: str = "",
    started_by: tuple[str | None, ...] = (),
    dag_id: str = "",
    dag_run_id: str = "",
) -> dict:
    """Record a person's answer to a gate pass waiting for approval: `choice` "Approve" promotes (a
    compare-and-swap on the champion the gate compared with), "Reject" or none (no answer in time)
    promotes nothing. training/registry.py decide_approval."""
    from training.ledger import APPROVE
    from training.registry import decide_approval

    ledger = _ledger(settings)
    try:
        decision = decide_approval(
            ModelRegistry(settings.mlflow_tracking_uri),
            ledger,
            version,
            choice == APPROVE,
            decided_by,
            comment,
            started_by,
            dag_id or None,
            dag_run_id or None,
            tuple(settings.approval.approvers),
        )
        history = ledger.history(MODEL_NAME)
    finally:
        ledger.dispose()
    record = {**_decision_record(decision), "decided_by": decision.decided_by, "comment": decision.comment}
    # the card again, with the answer in its history
    record |= _model_card(settings, ModelRegistry(settings.mlflow_tracking_uri), version, history)
    return _compress_promoted(settings, record)


@lineage.emits("promote_by_hand", _alias_lineage)
def promote_by_hand(
    settings: Settings,
    version: str,
    reason: str,
    expected_champion: str | None = None,
    actor: str | None = None,
) -> dict:
    from training.registry import PromotionError, promote_manually

    policy = settings.approval
    if policy.enabled and policy.approvers and actor not in policy.approvers:
        # With approval on, a promotion by hand is a sign-off: the approvers group's alone. Anyone else
        # puts the version through the gate, and a pass waits for them.
        raise PromotionError(
            f"approval is on (MLOPS_APPROVAL__ENABLED): only the approvers group "
            f"({', '.join(policy.approvers)}) may promote by hand, and {actor or 'an unnamed user'} is not "
            f"in it; `mlops promote --gate --version {version}` puts it through the gate, whose pass waits "
            "for them"
        )
    ledger = _ledger(settings)
    try:
        decision = promote_manually(
            ModelRegistry(settings.mlflow_tracking_uri), ledger, version, reason, expected_champion, actor
        )
    finally:
        ledger.dispose()
    return _compress_promoted(settings, _decision_record(decision))


@lineage.emits("rollback", _alias_lineage)
def rollback(
    settings: Settings,
    reason: str = "rollback",
    expected_champion: str | None = None,
    dag_id: str = "",
    dag_run_id: str = "",
    actor: str | None = None,
) -> dict:
    from training.registry import rollback as roll_back

    ledger = _ledger(settings)
    try:
        decision = roll_back(
            ModelRegistry(settings.mlflow_tracking_uri),
            ledger,
            reason,
            expected_champion,
            dag_id or None,
            dag_run_id or None,
            actor,
        )
    finally:
        ledger.dispose()
    return _decision_record(decision)


def history(settings: Settings, alias: bool = False) -> dict:
    """The promotion history; with `alias`, also where MLflow's champion alias points against it (`alias`:
    `out_of_band` when it was moved outside the history, by MLflow's client or UI; one registry read)."""
    from training.ledger import champion_stack
    from training.registry import MODEL_NAME, alias_state

    ledger = _ledger(settings)
    try:
        rows = ledger.history(MODEL_NAME)
    finally:
        ledger.dispose()
    stack = champion_stack(rows)
    record: dict[str, Any] = {
        "model": MODEL_NAME,
        "champion_version": stack[-1] if stack else None,
        "history": [row.to_dict() for row in rows],
    }
    if alias:
        record["alias"] = alias_state(ModelRegistry(settings.mlflow_tracking_uri), rows)
    return record


@lineage.emits("export", _export_lineage)
@_timed("export", _run_of_version)
def export(settings: Settings, version: str) -> dict:
    """fp32 ONNX of `version` for CPU scoring, checked against torch and logged to its run: every candidate
    gets it (a shadow or a later approval serves it). The smaller variants wait for a promotion (compress)."""
    from training.export import export_version

    return export_version(settings, version, variants=False)


@lineage.emits("compress", _export_lineage)
def compress(settings: Settings, version: str, decision: str) -> dict:
    """The int8, pruned and student variants of `version`, when `decision` promoted it: measured against fp32
    on the holdout, the smallest as accurate served (training/export.py). Made after the decision, off the
    path from arrival to it, and only for a version that serves. Otherwise `compressed` is False, `skip` True
    (the DAG's task skips) and `reason` says why."""
    if decision != "promoted":
        return {
            "model_version": version,
            "compressed": False,
            "skip": True,
            "reason": f"v{version} was not promoted ({decision}): fp32 alone stays exported",
        }
    from training.export import VARIANTS_TAG, export_version

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    tags = registry.client.get_model_version(registry.name, version).tags or {}
    if tags.get(VARIANTS_TAG) == "true":  # made when it was promoted before (a rollback, a manual promotion)
        return {
            "model_version": version,
            "compressed": False,
            "reason": f"v{version}'s variants were made before; it serves {tags.get('onnx.serving_file')}",
            "serving_file": tags.get("onnx.serving_file"),
        }
    started = time.perf_counter()
    report = export_version(settings, version, variants=True)
    log_stage_seconds(settings, _run_of_version(settings, report), "compress", time.perf_counter() - started)
    return {**report, "compressed": True}


def _compress_promoted(settings: Settings, record: dict) -> dict:
    """A person's promotion (an approval, `mlops promote`) makes the variants its version serves from; a
    failure leaves fp32 serving and says so in the record, and does not undo the promotion."""
    if record.get("decision") != "promoted" or not record.get("model_version"):
        return record
    try:
        made = compress(settings, str(record["model_version"]), "promoted")
        return {**record, "serving_file": made.get("serving_file")}
    except Exception as exc:  # the promotion stands; the variants can be made again
        log.error("v%s promoted, but its variants were not made: %s", record["model_version"], exc)
        return {**record, "compress_error": str(exc)}


# --- identical retrains ------------------------------------------------------------------------------------

RETRAIN_KEY_TAG = "lineage.retrain_key"


def _image(settings: Settings) -> str:
    return settings.training.image if settings.profile.value == "cluster" else "local"


def retrain_identity(settings: Settings, training_set_rev: str, config: TrainConfig) -> dict[str, str]:
    """What decides a trained model: the training set's revision, the code (its commit, with a digest of
    any uncommitted change), the training configuration (every argument that changes the result,
    TrainConfig.fingerprint) and the image."""
    from training.tracking import code_identity

    return {
        "training_set_rev": training_set_rev,
        "git_commit": code_identity(),
        "config": config.fingerprint(training_set_rev),
        "image": _image(settings),
    }


def retrain_key(identity: dict[str, str]) -> str | None:
    """A digest of the identity; None when the code's commit is unknown (nothing to match)."""
    import hashlib
    import json

    if identity["git_commit"] in ("", "unknown"):
        return None
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def identical(
    settings: Settings, training_set_rev: str, config: TrainConfig, dag_id: str = "", dag_run_id: str = ""
) -> dict:
    """Whether a registered version was trained from the same identity (retrain_identity). When one was, the
    skip is recorded as an MLflow run of its own (tags `retrain.*`: why, and which version) and the result
    says `identical` with the reason; otherwise `identical` is False."""
    import mlflow

    identity = retrain_identity(settings, training_set_rev, config)
    key = retrain_key(identity)
    if key is None:
        unknown = "the code's commit is unknown (no git, no MLOPS_GIT_COMMIT): nothing to compare with"
        return {"identical": False, "reason": unknown, **identity}
    from mlflow.exceptions import MlflowException

    registry = ModelRegistry(settings.mlflow_tracking_uri)
    try:
        versions = list(registry.client.search_model_versions(f"name='{registry.name}'"))
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        versions = []
    same = sorted((v for v in versions if v.tags.get(RETRAIN_KEY_TAG) == key), key=lambda v: int(v.version))
    if not same:
        return {"identical": False, "retrain_key": key, **identity}
    found = same[0]
    reason = (
        f"identical to v{found.version} (run {found.run_id}): training set {training_set_rev}, code "
        f"{identity['git_commit'][:12]}, configuration {identity['config']} and image {identity['image']} "
        "are all the same, so training would give the same model again; skipped (`mlops retrain --force` "
        "trains anyway)"
    )
    log.info("retrain skipped: %s", reason)
    experiment_id = configure(settings)
    with mlflow.start_run(experiment_id=experiment_id, run_name=f"skipped-{training_set_rev}") as run:
        mlflow.set_tags(
            {
                "retrain.skipped": "true",
                "retrain.reason": reason,
                "retrain.identical_to_version": str(found.version),
                **{f"lineage.{k}": v for k, v in identity.items()},
                RETRAIN_KEY_TAG: key,
                "lineage.dag_id": dag_id,
                "lineage.dag_run_id": dag_run_id,
            }
        )
    return {
        "identical": True,
        "status": "skipped",
        "reason": reason,
        "model_version": str(found.version),
        "run_id": found.run_id,
        "skip_run_id": run.info.run_id,
        "retrain_key": key,
        **identity,
    }


def retrain(
    settings: Settings,
    day: date,
    config: TrainConfig,
    window_days: int | None = None,
    training_set_rev: str | None = None,
    dag_id: str = "",
    dag_run_id: str = "",
    force: bool = False,
    actor: str | None = None,
) -> dict:
    """All steps in turn, in this process (what `mlops retrain` and the local profile run). Unless `force`,
    a retrain whose identity equals a registered version's stops after the training set, `skipped`. The
    gate's decision is recorded with `actor` (the command's user) or else the DAG run as its actor."""
    clock = StageClock()  # seconds per step, as the retrain DAG's tasks
    record: dict = {"experiment": EXPERIMENT, "as_of": day.isoformat(), "seconds_per_step": clock.seconds}
    if training_set_rev is None:
        built = clock.run("training_set", lambda: dataset(settings, day, window_days))
        training_set_rev = built["training_set_rev"]
        record["rows"] = built["rows"]
        record["splits"] = built["splits"]
        record["negative_sample_rate"] = built.get("negative_sample_rate", 1.0)
    record["training_set_rev"] = training_set_rev
    if not force:
        same = identical(settings, training_set_rev, config, dag_id, dag_run_id)
        if same["identical"]:
            return {**record, **same}
    built_in = clock.seconds.get("training_set")
    trained = clock.run(
        "train",
        lambda: train(
            settings, training_set_rev, config, dag_id=dag_id, dag_run_id=dag_run_id,
            training_set_seconds=built_in,
        ),
    )  # fmt: skip
    if trained["status"] != "trained":
        return {**record, **trained}
    record.update(trained)
    record["holdout"] = clock.run("evaluate", lambda: evaluate(settings, trained["run_id"]))["holdout"]
    version = clock.run("register", lambda: register(settings, trained["run_id"]))["model_version"]
    decision = clock.run(
        "promote",
        # a command's user started the run: they may not approve it (DAG runs name their own starter)
        lambda: promote(
            settings, version, dag_id=dag_id, dag_run_id=dag_run_id, actor=actor, triggered_by=actor
        ),
    )
    record.update(decision)
    record["export"] = clock.run("export", lambda: export(settings, version))
    record["compress"] = clock.run("compress", lambda: compress(settings, version, decision["decision"]))
    record["status"] = "ok"
    return record
