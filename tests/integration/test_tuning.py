"""Hyperparameter search for real: an Optuna study in SQLite, trials as separate `python -m training trial`
processes running at the same time (as the tuning DAG's mapped tasks do), the median pruner, nested MLflow
runs, resumption after a crash, and the next retrain training with the best trial's parameters."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core.settings import Settings, TuningSettings, settings_as_env
from tests.conftest import wait_for
from tests.integration.training_sets import AS_OF, versioned_training_set

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def _trial_process(settings: Settings, study: str, slot: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "training", "trial", "--study", study, "--slot", str(slot), "--device", "cpu"],
        cwd=REPO,
        # as a task process has it: no MLFLOW_TRACKING_URI left behind by this process's own MLflow calls
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")},
            **settings_as_env(settings),
            "OMP_NUM_THREADS": "1",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(process: subprocess.Popen) -> dict:
    stdout, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A study of four trials, two at a time, run as the DAG runs them; then a crash and a rerun of slot 1."""
    from training import tuning

    settings = Settings(
        home=tmp_path_factory.mktemp("tuning") / "home",
        tuning=TuningSettings(
            trials=4, parallelism=2, epochs=3, pruner_startup_trials=1, pruner_warmup_epochs=0
        ),
    )
    rev = versioned_training_set(settings)
    started = tuning.start(settings, AS_OF.isoformat(), rev)
    study = started["study"]
    first = [_trial_process(settings, study, slot) for slot in (0, 1)]
    results = [_result(p) for p in first]
    # Slot 2 gets parameters that learn slowly (one optimizer step per epoch at the smallest learning rate):
    # after slots 0 and 1 its first epoch is below their median, so the pruner stops it.
    tuning._load(settings, study).enqueue_trial(
        {"hidden_width": 64, "hidden_layers": 1, "learning_rate": 3e-4, "batch_size": 2048,
         "weight_decay": 1e-6, "dropout": 0.3}
    )  # fmt: skip
    results.append(_result(_trial_process(settings, study, 2)))
    # Slot 3's process is killed while it trains (a lost worker); the retry fails that trial and runs anew.
    killed = _trial_process(settings, study, 3)
    wait_for(
        lambda: _running_trial(settings, study, slot=3) or killed.poll() is not None,
        300,
        "slot 3 to start its trial",
    )
    assert killed.poll() is None, f"slot 3 exited {killed.returncode} before it was killed"
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=60)
    results.append(_result(_trial_process(settings, study, 3)))
    rerun = _result(_trial_process(settings, study, 1))  # a slot run again after it finished
    finished = tuning.finish(settings, study)
    return settings, started, results, rerun, finished


def _running_trial(settings: Settings, study: str, slot: int) -> bool:
    from optuna.trial import TrialState

    from training import tuning

    return any(
        t.user_attrs.get("slot") == slot and t.state is TrialState.RUNNING and "mlflow_run_id" in t.user_attrs
        for t in tuning._load(settings, study).get_trials(deepcopy=False)
    )


def test_trials_of_two_slots_ran_at_the_same_time(tuned):
    from training import tuning

    settings, started, results, _, _ = tuned
    trials = {t.number: t for t in tuning._load(settings, started["study"]).get_trials(deepcopy=False)}
    first, second = (trials[r["trial"]] for r in results[:2])
    assert first.datetime_start < second.datetime_complete and second.datetime_start < first.datetime_complete
    assert {r["slot"] for r in results} == {0, 1, 2, 3}


def test_the_pruner_stops_a_trial_that_learns_slowly(tuned):
    _, _, results, _, finished = tuned
    slow = results[2]
    assert slow["state"] == "PRUNED", slow
    assert slow["epochs"] < 3 and "pruned after epoch" in slow["reason"]
    assert finished["trials"]["pruned"] >= 1


def test_a_killed_trial_is_failed_and_its_slot_runs_again_and_a_finished_slot_is_not_rerun(tuned):
    from optuna.trial import TrialState

    from training import tuning

    settings, started, results, rerun, finished = tuned
    (failed,) = [
        t
        for t in tuning._load(settings, started["study"]).get_trials(deepcopy=False)
        if t.state is TrialState.FAIL
    ]
    assert failed.user_attrs["slot"] == 3 and "abandoned" in failed.user_attrs["reason"]
    assert results[3]["state"] in {"COMPLETE", "PRUNED"} and results[3]["resumed"] is False
    assert finished["trials"]["fail"] == 1  # the killed one, with the reason a person reads in the study
    assert rerun["resumed"] is True and rerun["trial"] == results[1]["trial"]
    assert finished["trials"]["complete"] + finished["trials"]["pruned"] == 4


def test_trials_are_mlflow_runs_nested_under_the_study_run_which_records_the_best(tuned):
    import mlflow

    settings, started, results, _, finished = tuned
    client = mlflow.MlflowClient(settings.mlflow_tracking_uri)
    parent = client.get_run(started["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert float(parent.data.metrics["best_validation_auc_pr"]) == pytest.approx(
        finished["best_validation_auc_pr"]
    )
    assert json.loads(parent.data.params["best.hidden"]) == finished["best_params"]["hidden"]
    children = mlflow.search_runs(
        experiment_ids=[parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
        output_format="list",
    )
    assert len(children) == 5  # four slots and the killed attempt
    killed = [run for run in children if run.data.tags.get("tuning.state") == "FAIL"]
    assert len(killed) == 1 and killed[0].info.status == "FAILED"
    assert "abandoned" in killed[0].data.tags["tuning.reason"]
    by_trial = {int(run.data.tags["tuning.trial"]): run for run in children}
    for result in results:
        run = by_trial[result["trial"]]
        assert run.info.run_id == result["mlflow_run_id"]
        history = client.get_metric_history(run.info.run_id, "validation_auc_pr")
        assert len(history) == result["epochs"] >= 1


def test_the_next_retrain_trains_with_the_best_trial_and_says_so(tuned):
    import mlflow

    from training import steps, tuning

    settings, started, _, _, finished = tuned
    best = tuning.best_hyperparameters(settings)
    assert best is not None and best.study == started["study"] and best.params == finished["best_params"]
    config = tuning.train_config(settings, epochs=1, device="cpu")
    assert (
        config.learning_rate == best.params["learning_rate"] and list(config.hidden) == best.params["hidden"]
    )
    assert config.batch_size == best.params["batch_size"] and config.dropout == best.params["dropout"]
    trained = steps.train(settings, started["training_set_rev"], config)
    run = mlflow.MlflowClient(settings.mlflow_tracking_uri).get_run(trained["run_id"])
    assert run.data.tags["tuning.source"] == best.source
    assert list(ast.literal_eval(run.data.params["model.hidden"])) == best.params["hidden"]
    # an explicit option still wins, and the setting turns the study's parameters off
    assert tuning.train_config(settings, learning_rate=0.01).learning_rate == 0.01
    off = settings.model_copy(
        update={"tuning": settings.tuning.model_copy(update={"use_best_params": False})}
    )
    assert tuning.train_config(off).learning_rate == settings.training.learning_rate


def test_a_study_refuses_another_training_set_and_a_finish_without_a_completed_trial(tmp_path):
    from training import tuning

    settings = Settings(home=tmp_path / "home", tuning=TuningSettings(trials=1))
    rev = versioned_training_set(settings)
    started = tuning.start(settings, "2026-03-02", rev)
    assert tuning.start(settings, "2026-03-02", rev)["parent_run_id"] == started["parent_run_id"]  # resumed
    with pytest.raises(tuning.TuningError, match=f"was started on training set {rev}, not other"):
        tuning.start(settings, "2026-03-02", "other")
    with pytest.raises(tuning.TuningError, match="no trial completed"):
        tuning.finish(settings, started["study"])
    assert tuning.best_hyperparameters(settings) is None


def test_in_the_cluster_profile_the_study_lives_in_postgresql_and_a_retrain_finds_its_best(tmp_path):
    """The cluster's storage: the profile's PostgreSQL (a database of this test's own); a finished study is
    read back the way a retrain reads it."""
    import uuid

    import optuna
    import sqlalchemy as sa

    from core.settings import ClusterServices, Profile
    from training import tuning

    name = f"mlops_t_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(
        "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres", isolation_level="AUTOCOMMIT"
    )
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    # The database is Airflow's metadata database too: its migrations' `alembic_version` is already there.
    shared = sa.create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}")
    with shared.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
        conn.exec_driver_sql("INSERT INTO alembic_version VALUES ('d2f4e1b3c5a7')")
    shared.dispose()
    try:
        settings = Settings(
            profile=Profile.CLUSTER,
            home=tmp_path / "home",
            cluster=ClusterServices(postgres_dsn=f"postgresql://postgres@127.0.0.1:5432/{name}"),
        )
        assert settings.tuning_storage_url.startswith("postgresql+psycopg2://")
        assert tuning.best_hyperparameters(settings) is None  # no study yet, and nothing made to find out
        assert "optuna" not in sa.inspect(sa.create_engine(settings.tuning_storage_url)).get_schema_names()
        study_name = tuning.study_name(settings, "2026-03-02")
        study = optuna.create_study(
            study_name=study_name, storage=tuning.storage(settings), direction="maximize"
        )
        for value, width in ((0.41, 64), (0.47, 256)):
            study.enqueue_trial(
                {"hidden_width": width, "hidden_layers": 2, "learning_rate": 1e-3, "batch_size": 512,
                 "weight_decay": 1e-4, "dropout": 0.1}
            )  # fmt: skip
            trial = tuning._load(settings, study_name).ask()
            assert tuning.suggest(trial)["hidden"] == [width, width // 2]
            study.tell(trial, value)
        study.set_user_attr("finished_at", "2026-03-03T00:00:00")
        best = tuning.best_hyperparameters(settings)
        assert best is not None and best.study == study_name and best.value == 0.47
        assert best.params["hidden"][0] == 256
        # Airflow's revision untouched; Optuna's tables in their own schema
        check = sa.create_engine(settings.tuning_storage_url)
        with check.connect() as conn:
            assert (
                conn.exec_driver_sql("SELECT version_num FROM public.alembic_version").scalar()
                == "d2f4e1b3c5a7"
            )
        assert sa.inspect(check).has_table("studies", schema="optuna")
        check.dispose()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.dispose()
