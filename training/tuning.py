"""Hyperparameter search: an Optuna study in the profile's database whose trials are real training runs.

The tune_fraud_model DAG (and `mlops tune`, which triggers it) calls, in order:
- `start`: the study `<prefix>-<as-of>` on one training-set revision, and its MLflow parent run;
- `run_trial`, once per slot, as mapped tasks running `parallelism` at a time: each asks the study for
  parameters, trains on the training set's train split, reports validation AUC-PR after every epoch so the
  median pruner can stop a poor trial early, and tells the study the outcome; each trial is an MLflow run
  nested under the parent;
- `finish`: the best trial's parameters recorded on the parent run and the study marked finished.

A retrain then trains with the best parameters of the latest finished study (`best_hyperparameters`; the
setting `tuning.use_best_params`), and still goes through the gate.

Crash safety: a slot's trial carries the slot number, so a slot that is run again (an Airflow retry, a rerun
of the DAG run, `mlops tune` after a crash) returns its finished trial instead of training again; a trial left
RUNNING by a process that died is marked FAIL and the slot asks for a new one. The study, its trials and their
intermediate values live in the database, so nothing finished is lost.

Imports optuna and torch inside functions: the module is read by the training CLI, which runs in the training
image (pods) or as a child process of a task (local profile).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.errors import PipelineError

if TYPE_CHECKING:
    import optuna

    from core.settings import Settings
    from training.loop import TrainConfig

log = logging.getLogger(__name__)

# What a study searches, each a key of TrainConfig.from_settings(tuned=...). Ranges around the defaults
# (learning rate 2e-3, batch 512, weight decay 1e-4, hidden (128, 64), dropout 0.1).
TUNED_KEYS = ("learning_rate", "batch_size", "weight_decay", "hidden", "dropout")
BATCH_SIZES = (256, 512, 1024, 2048)
HIDDEN_WIDTHS = (64, 128, 256)


class TuningError(PipelineError):
    """A study that cannot go on as asked (another training set, no trial finished); says what to do."""


@dataclass(frozen=True)
class Tuned:
    """Hyperparameters from a study's best trial, and where they came from (recorded on the training run)."""

    params: dict[str, Any]
    study: str
    trial: int
    value: float

    @property
    def source(self) -> str:
        return f"study {self.study} trial {self.trial} (validation AUC-PR {self.value:.4f})"


def study_name(settings: Settings, as_of: str) -> str:
    return f"{settings.tuning.study_prefix}-{as_of}"


def suggest(trial: optuna.Trial) -> dict[str, Any]:
    """One trial's hyperparameters, in the form TrainConfig.from_settings(tuned=...) takes."""
    width = trial.suggest_categorical("hidden_width", HIDDEN_WIDTHS)
    layers = trial.suggest_int("hidden_layers", 1, 3)
    return {
        "learning_rate": trial.suggest_float("learning_rate", 3e-4, 1e-2, log=True),
        "batch_size": trial.suggest_categorical("batch_size", BATCH_SIZES),
        "weight_decay": trial.suggest_float("weight_decay", 1e-6, 1e-2, log=True),
        "hidden": hidden_layers(int(width), layers),
        "dropout": trial.suggest_float("dropout", 0.0, 0.3),
    }


def hidden_layers(width: int, layers: int) -> list[int]:
    """A funnel: each layer half the one before, at least 16 wide."""
    return [max(16, width // 2**i) for i in range(layers)]


def decode(params: dict[str, Any]) -> dict[str, Any]:
    """A finished trial's stored parameters (Optuna's names) as the training hyperparameters."""
    return {
        "learning_rate": float(params["learning_rate"]),
        "batch_size": int(params["batch_size"]),
        "weight_decay": float(params["weight_decay"]),
        "hidden": hidden_layers(int(params["hidden_width"]), int(params["hidden_layers"])),
        "dropout": float(params["dropout"]),
    }


# In the cluster profile the study shares the PostgreSQL database of Airflow's metadata and the promotion
# history. Optuna keeps its schema version in an `alembic_version` table, the name Airflow's (and MLflow's)
# migrations use too: in one schema Optuna reads Airflow's revision and refuses the storage ("no longer
# compatible with the table schema"). Its tables live in a schema of their own.
POSTGRES_SCHEMA = "optuna"


def _is_sqlite(settings: Settings) -> bool:
    return settings.tuning_storage_url.startswith("sqlite")


def _engine_kwargs(settings: Settings) -> dict[str, Any]:
    if _is_sqlite(settings):
        # parallel trial processes write the same file: wait for its lock instead of failing at once
        return {"connect_args": {"timeout": 120}}
    return {"connect_args": {"options": f"-csearch_path={POSTGRES_SCHEMA}"}}


def storage(settings: Settings) -> optuna.storages.RDBStorage:
    """The study storage, its tables made on first use (the SQLite file, or the PostgreSQL schema)."""
    import optuna
    import sqlalchemy as sa

    url = settings.tuning_storage_url
    if _is_sqlite(settings):
        settings.mlflow_dir.mkdir(parents=True, exist_ok=True)
    else:
        engine = sa.create_engine(url)
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {POSTGRES_SCHEMA}")
        finally:
            engine.dispose()
    return optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(settings))


def _has_studies(settings: Settings) -> bool:
    """Whether the storage's tables exist, without making them (a retrain only reads)."""
    if _is_sqlite(settings):
        return settings.mlflow_dir.joinpath("optuna.db").is_file()
    import sqlalchemy as sa

    engine = sa.create_engine(settings.tuning_storage_url)
    try:
        return sa.inspect(engine).has_table("studies", schema=POSTGRES_SCHEMA)
    finally:
        engine.dispose()


def _load(settings: Settings, name: str, slot: int = 0) -> optuna.Study:
    import optuna

    tuning = settings.tuning
    # Each slot seeds its own sampler: slots started together would otherwise draw the same first parameters.
    sampler = optuna.samplers.TPESampler(seed=tuning.seed + slot, n_startup_trials=max(2, tuning.trials // 3))
    pruner = optuna.pruners.MedianPruner(
        n_startup_trials=tuning.pruner_startup_trials, n_warmup_steps=tuning.pruner_warmup_epochs
    )
    try:
        return optuna.load_study(study_name=name, storage=storage(settings), sampler=sampler, pruner=pruner)
    except KeyError:
        raise TuningError(
            f"no study {name!r} in {_shown(settings)}: start it first (the tune DAG's start_study task, or "
            "`python -m training tune-start`)"
        ) from None


def _shown(settings: Settings) -> str:
    url = settings.tuning_storage_url
    return url.split("@")[-1] if "@" in url else url  # no credentials in messages


def start(settings: Settings, as_of: str, training_set_rev: str) -> dict:
    """Create (or resume) the study of `as_of` on `training_set_rev`, with its MLflow parent run."""
    import mlflow
    import optuna

    from training.tracking import configure

    name = study_name(settings, as_of)
    study = optuna.create_study(
        study_name=name, storage=storage(settings), direction="maximize", load_if_exists=True
    )
    attrs = study.user_attrs
    if attrs.get("training_set_rev", training_set_rev) != training_set_rev:
        raise TuningError(
            f"study {name} was started on training set {attrs['training_set_rev']}, not {training_set_rev}: "
            f"its trials are compared on one training set. Finish it on that revision, or set "
            f"MLOPS_TUNING__STUDY_PREFIX to start another study"
        )
    parent = attrs.get("parent_run_id")
    if parent is None:
        experiment_id = configure(settings)
        run = mlflow.MlflowClient(settings.mlflow_tracking_uri).create_run(
            experiment_id,
            run_name=f"tune-{name}",
            tags={"tuning.study": name, "lineage.training_set_rev": training_set_rev, "lineage.as_of": as_of},
        )
        parent = run.info.run_id
        study.set_user_attr("training_set_rev", training_set_rev)
        study.set_user_attr("as_of", as_of)
        study.set_user_attr("parent_run_id", parent)
    trials = settings.tuning.trials
    return {
        "study": name,
        "training_set_rev": training_set_rev,
        "parent_run_id": parent,
        "trials": trials,
        "slots": list(range(trials)),
        "trials_done": sum(1 for t in study.get_trials(deepcopy=False) if t.state.is_finished()),
    }


def _trial_record(study: str, trial: optuna.trial.FrozenTrial, resumed: bool) -> dict:
    value = trial.value
    return {
        "study": study,
        "trial": trial.number,
        "slot": trial.user_attrs.get("slot"),
        "state": trial.state.name,
        "value": value if value is not None and math.isfinite(value) else None,
        "epochs": len(trial.intermediate_values),
        "params": decode(trial.params) if trial.params else {},
        "mlflow_run_id": trial.user_attrs.get("mlflow_run_id"),
        "reason": trial.user_attrs.get("reason", ""),
        "resumed": resumed,
    }


def run_trial(
    settings: Settings, name: str, slot: int, device: str = "auto", checkpoint_dir: Path | None = None
) -> dict:
    """Slot `slot` of study `name`: its finished trial if it has one, else a new trial trained here
    (checkpoints under `checkpoint_dir`/<study>/<trial>, default $MLOPS_HOME/checkpoints/tuning)."""
    import optuna
    from optuna.trial import TrialState

    study = _load(settings, name, slot)
    for previous in study.get_trials(deepcopy=False):
        if previous.user_attrs.get("slot") != slot:
            continue
        if previous.state in (TrialState.COMPLETE, TrialState.PRUNED):
            log.info("slot %d of %s already ran as trial %d: %s", slot, name, previous.number, previous.state)
            return _trial_record(name, previous, resumed=True)
        if previous.state is TrialState.RUNNING:  # its process died (this is a retry of the slot)
            _fail_abandoned(settings, study, previous)
    trial = study.ask()
    trial.set_user_attr("slot", slot)
    tuned = suggest(trial)
    try:
        folder = (checkpoint_dir or settings.checkpoints_dir / "tuning") / name / str(trial.number)
        outcome = _train_trial(settings, study, trial, tuned, device, folder)
    except optuna.TrialPruned as pruned:
        trial.set_user_attr("reason", str(pruned))
        study.tell(trial, state=TrialState.PRUNED)
    except PipelineError as refused:  # a diverged trial is an outcome of the search, not a task failure
        trial.set_user_attr("reason", str(refused))
        study.tell(trial, state=TrialState.FAIL)
    except BaseException:
        study.tell(trial, state=TrialState.FAIL)
        raise
    else:
        study.tell(trial, outcome)
    return _trial_record(name, study.trials[trial.number], resumed=False)


def _fail_abandoned(settings: Settings, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """A trial whose process died: FAIL in the study, and its MLflow run (if it got one) ended as FAILED."""
    import mlflow
    from optuna.trial import TrialState

    reason = "abandoned: the process running it ended without reporting (killed or lost)"
    # A FrozenTrial has no public setter: the storage's (optuna pinned below 6; tests/integration/test_tuning
    # reads the reason back).
    study._storage.set_trial_user_attr(trial._trial_id, "reason", reason)
    study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
    run_id = trial.user_attrs.get("mlflow_run_id")
    if run_id:
        client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
        client.set_tag(run_id, "tuning.state", "FAIL")
        client.set_tag(run_id, "tuning.reason", reason)
        client.set_terminated(run_id, "FAILED")


def _train_trial(
    settings: Settings,
    study: optuna.Study,
    trial: optuna.Trial,
    tuned: dict[str, Any],
    device: str,
    checkpoints: Path,
) -> float:
    import mlflow
    import optuna
    import torch

    from training.dataset import read_training_set
    from training.loop import TrainConfig
    from training.loop import train as fit
    from training.model import FraudMLP, ModelConfig
    from training.steps import split_tensors
    from training.tracking import configure

    rev = study.user_attrs["training_set_rev"]
    config = TrainConfig.from_settings(
        settings.training, tuned=tuned, epochs=settings.tuning.epochs, device=device, precision="auto"
    )
    frame = read_training_set(settings, rev)
    model_config = ModelConfig(hidden=tuple(config.hidden), dropout=config.dropout)
    train_data, validation = (
        split_tensors(frame, split, model_config.inputs) for split in ("train", "validation")
    )
    torch.manual_seed(config.seed)
    model = FraudMLP(model_config)
    model.fit_normalization(train_data.x[:, : model_config.numeric])

    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    run = client.create_run(
        configure(settings),
        run_name=f"{study.study_name}-trial-{trial.number}",
        tags={
            "mlflow.parentRunId": study.user_attrs["parent_run_id"],
            "tuning.study": study.study_name,
            "tuning.trial": str(trial.number),
            "tuning.slot": str(trial.user_attrs["slot"]),
            "lineage.training_set_rev": rev,
        },
    )
    run_id = run.info.run_id
    trial.set_user_attr("mlflow_run_id", run_id)
    for key, value in tuned.items():
        client.log_param(run_id, key, value)

    def on_epoch_end(epoch: int, record: dict) -> None:
        value = record["validation_auc_pr"]
        client.log_metric(run_id, "validation_auc_pr", value, step=epoch)
        client.log_metric(run_id, "train_loss", record["train_loss"], step=epoch)
        trial.report(value, epoch)
        if trial.should_prune():
            raise optuna.TrialPruned(
                f"pruned after epoch {epoch}: validation AUC-PR {value:.4f} is below the median of earlier "
                "trials at that epoch"
            )

    try:
        result = fit(model, train_data, validation, config, checkpoints, rev, on_epoch_end)
    except optuna.TrialPruned:
        client.set_tag(run_id, "tuning.state", "PRUNED")
        client.set_terminated(run_id, "KILLED")
        raise
    except BaseException as failed:
        client.set_tag(run_id, "tuning.state", "FAIL")
        client.set_tag(run_id, "tuning.reason", str(failed)[:5000])
        client.set_terminated(run_id, "FAILED")
        raise
    client.log_metric(run_id, "best_validation_auc_pr", result.best_validation_auc_pr)
    client.set_tag(run_id, "tuning.state", "COMPLETE")
    client.set_terminated(run_id, "FINISHED")
    return result.best_validation_auc_pr


def finish(settings: Settings, name: str) -> dict:
    """Record the best trial on the parent run and mark the study finished (what a retrain then uses)."""
    import mlflow
    from optuna.trial import TrialState

    study = _load(settings, name)
    for trial in study.get_trials(deepcopy=False):
        if trial.state is TrialState.RUNNING:  # every slot task has ended: nobody runs it any more
            _fail_abandoned(settings, study, trial)
    trials = study.get_trials(deepcopy=False)
    counts = {state.name.lower(): sum(1 for t in trials if t.state is state) for state in TrialState}
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    parent = study.user_attrs["parent_run_id"]
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    if not complete:
        reasons = sorted({t.user_attrs.get("reason", "") for t in trials} - {""})
        client.set_terminated(parent, "FAILED")
        raise TuningError(
            f"study {name}: no trial completed ({counts['pruned']} pruned, {counts['fail']} failed"
            + (f"; e.g. {reasons[0][:300]}" if reasons else "")
            + "): nothing to recommend; widen the search or raise MLOPS_TUNING__EPOCHS and run it again"
        )
    best = study.best_trial
    params = decode(best.params)
    finished_at = max(t.datetime_complete for t in trials if t.datetime_complete is not None)
    study.set_user_attr("finished_at", finished_at.isoformat())
    study.set_user_attr("best_trial", best.number)
    for key, value in params.items():
        client.log_param(parent, f"best.{key}", value)
    client.log_metric(parent, "best_validation_auc_pr", float(best.value or 0.0))
    for state, count in counts.items():
        client.log_metric(parent, f"trials_{state}", count)
    client.set_tag(parent, "tuning.best_trial", str(best.number))
    client.set_terminated(parent, "FINISHED")
    return {
        "study": name,
        "best_trial": best.number,
        "best_validation_auc_pr": best.value,
        "best_params": params,
        "trials": counts,
        "parent_run_id": parent,
        "finished_at": finished_at.isoformat(),
    }


def best_hyperparameters(settings: Settings) -> Tuned | None:
    """The best trial of the latest finished study (None: none finished, or tuning.use_best_params off)."""
    if not settings.tuning.use_best_params:
        return None
    if not _has_studies(settings):
        return None  # never tuned here: do not create the storage just to find that out
    import optuna

    prefix = f"{settings.tuning.study_prefix}-"
    finished = [
        summary
        for summary in optuna.get_all_study_summaries(storage(settings), include_best_trial=True)
        if summary.study_name.startswith(prefix)
        and "finished_at" in summary.user_attrs
        and summary.best_trial is not None
    ]
    if not finished:
        return None
    latest = max(finished, key=lambda s: s.user_attrs["finished_at"])
    best = latest.best_trial
    assert best is not None and best.value is not None
    return Tuned(decode(best.params), latest.study_name, best.number, float(best.value))


def train_config(settings: Settings, **options: Any) -> TrainConfig:
    """A retrain's TrainConfig: the options given, then the latest finished study's best hyperparameters
    (when tuning.use_best_params), then the training settings."""
    from training.loop import TrainConfig

    tuned = best_hyperparameters(settings)
    if tuned is not None:
        log.info("hyperparameters from %s: %s", tuned.source, tuned.params)
    return TrainConfig.from_settings(
        settings.training,
        tuned=tuned.params if tuned else None,
        tuned_from=tuned.source if tuned else "",
        **options,
    )
