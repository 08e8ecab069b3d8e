"""The retrain DAG through real Airflow (dag.test) on features built by the real pipeline (Spark, GX, DVC,
Feast), training with torch in a child process (the local profile's train task), MLflow on SQLite; then
the `mlops` commands (in this process) on the same installation: retrain, history and rollback."""

from __future__ import annotations

import getpass
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from core.settings import get_settings
from tests import lake as reference
from tests.gate_rule import decision_by_auc_pr
from tests.integration.conftest import dag_run_states
from training.registry import GatePolicy

DAYS = reference.DAYS
LAST = DAYS[-1]


@pytest.fixture(scope="module")
def features_home(tmp_path_factory, spark):
    """A copy of the reference lake (tests/lake.py: four featurized days of a feed with every fault kind),
    once for the module; each test takes its own copy of it (`_copy`)."""
    return reference.reference_lake(tmp_path_factory.mktemp("retrain-home") / "home").home


def _point_at(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLOPS_HOME", str(home))
    monkeypatch.setenv("MLOPS_TRAINING__EPOCHS", "3")
    monkeypatch.setenv("MLOPS_TRAINING__LABEL_MATURITY_DAYS", "1")
    get_settings.cache_clear()


def _copy(features_home: Path, to: Path) -> Path:
    """An installation of its own, featurized as `features_home` is: what one test registers, promotes or
    tunes there no other test sees, so each passes alone and in any order (Parquet hard-linked, the rest
    copied, Feast's registry applied to the copy: tests/lake.py `copy_home`)."""
    reference.copy_home(features_home, to, str(features_home))
    return to


@pytest.fixture
def home(features_home, tmp_path, monkeypatch):
    """This test's own copy of the featurized installation, set as MLOPS_HOME."""
    copy = _copy(features_home, tmp_path / "home")
    _point_at(copy, monkeypatch)
    yield copy
    get_settings.cache_clear()


@dataclass(frozen=True)
class DagRetrain:
    home: Path
    run_id: str
    states: dict[str, str]


@pytest.fixture(scope="module")
def dag_retrain(features_home, airflow_db, tmp_path_factory) -> Iterator[DagRetrain]:
    """The retrain DAG run once (dag.test) on a copy of the featurized installation with no model yet."""
    from airflow.dag_processing.dagbag import DagBag

    home = _copy(features_home, tmp_path_factory.mktemp("dag-retrain") / "home")
    with pytest.MonkeyPatch.context() as patch:
        _point_at(home, patch)
        dag = DagBag(dag_folder="dags").dags["retrain_fraud_model"]
        run = dag.test(run_conf={"as_of": LAST.isoformat()})
        states = dag_run_states(run)
    get_settings.cache_clear()
    yield DagRetrain(home=home, run_id=run.run_id, states=states)


def _mlops(*args: str) -> tuple[int, dict]:
    """`mlops ARGS --json` in this process, on the settings of the environment (`home`): its Spark session
    and its imports of torch and MLflow serve every call, where a child process started a JVM and imported
    them again for each. The process itself is not what these tests check (tests/integration/test_doctor.py
    and the e2e tests run the installed `mlops`)."""
    from typer.testing import CliRunner

    from mlops.cli import app

    get_settings.cache_clear()
    done = CliRunner().invoke(app, [*args, "--json"])
    if done.exception is not None and not isinstance(done.exception, SystemExit):
        raise done.exception  # a crash, not a refusal: its own traceback
    return done.exit_code, {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def test_retrain_dag_trains_registers_gates_and_exports(dag_retrain, monkeypatch):
    import mlflow

    _point_at(dag_retrain.home, monkeypatch)
    successful = ("as_of_date", "training_set", "skip_identical", "train", "evaluate", "register", "promote")
    assert dag_retrain.states == {
        **dict.fromkeys((*successful, "export"), "success"),
        "compress": "skipped",  # the gate rejects this first model (below), so no variants are made for it
        "ask_approval": "skipped",  # approval.enabled is off
    }

    settings = get_settings()
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    client = mlflow.MlflowClient()
    (version,) = client.search_model_versions("name='fraud-detector'")
    run_data = client.get_run(version.run_id).data
    assert run_data.tags["lineage.dag_id"] == "retrain_fraud_model"
    assert run_data.tags["lineage.dag_run_id"] == dag_retrain.run_id
    assert run_data.tags["lineage.feature_service"] == "fraud_model_v1"
    assert run_data.tags["lineage.gx_success"] == "True"
    assert run_data.tags["lineage.as_of"] == LAST.isoformat()
    assert "holdout_auc_pr" in run_data.metrics and "onnx_parity_max_abs_diff" in run_data.metrics
    history = client.get_metric_history(version.run_id, "validation_auc_pr")
    assert [m.step for m in history] == list(range(len(history))) and len(history) >= 1
    artifacts = {a.path for a in client.list_artifacts(version.run_id, "evaluation")}
    assert artifacts == {
        f"evaluation/{n}.png" for n in ("pr_curve", "roc_curve", "confusion_matrix", "calibration")
    }
    assert float(version.tags["onnx.parity_max_abs_diff"]) < 1e-4
    # every task's seconds on the run, the training set's passed on by the train task
    stages = {"training_set", "train", "evaluate", "register", "promote", "export"}
    assert {
        k.removeprefix("stage_seconds.") for k in run_data.metrics if k.startswith("stage_seconds.")
    } == stages
    assert all(run_data.metrics[f"stage_seconds.{s}"] > 0 for s in stages)

    # The same as-of again (a drift event for a date already trained): the DAG's skip_identical task skips
    # the training and everything after it, and says why.
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.exceptions import AirflowSkipException

    pushed: dict = {}
    ti = SimpleNamespace(
        xcom_pull=lambda task_ids: {"training_set_rev": run_data.tags["lineage.training_set_rev"]},
        xcom_push=lambda key, value: pushed.update({key: value}),
    )
    dag = DagBag(dag_folder="dags").dags["retrain_fraud_model"]
    assert dag.task_dict["train"].upstream_task_ids == {"skip_identical"}
    with pytest.raises(AirflowSkipException, match=f"identical to v{version.version}"):
        dag.task_dict["skip_identical"].python_callable(
            params={"force": False},
            ti=ti,
            dag_run=SimpleNamespace(dag_id="retrain_fraud_model", run_id="again"),
        )
    assert f"identical to v{version.version} (run {version.run_id})" in pushed["skipped"]
    assert run_data.tags["lineage.retrain_key"] == version.tags["lineage.retrain_key"] != ""
    assert len(client.search_model_versions("name='fraud-detector'")) == 1  # nothing new registered

    code, recorded = _mlops("history")
    assert code == 0
    (decision,) = recorded["history"]
    assert decision["candidate_version"] == str(version.version)
    assert decision["dag_id"] == "retrain_fraud_model" and decision["run_id"] == dag_retrain.run_id
    # The installation's first model has only the floor (AUC-PR 0.10) to clear, and on this seeded feed it
    # does not: three frauds in the holdout, AUC-PR 0.040 when measured. No champion yet.
    auc_pr = decision["candidate_metrics"]["auc_pr"]
    policy = GatePolicy(**settings.gate.model_dump())
    assert decision["decision"] == decision_by_auc_pr(auc_pr, None, policy) == "rejected", decision
    assert "is below the floor" in decision["reason"]
    assert decision["champion_before"] is None and decision["champion_after"] is None
    assert recorded["champion_version"] is None


def test_cli_retrain_history_and_rollback(home, monkeypatch):
    monkeypatch.setenv("MLOPS_GATE__FLOOR", "0")  # a first model is promoted whatever it scores
    get_settings.cache_clear()
    policy = GatePolicy(**get_settings().gate.model_dump())
    code, first = _mlops("retrain", "--date", LAST.isoformat())
    assert code == 0, first
    assert {"model_version", "champion_version", "decision", "primary_metric", "auc_pr"} <= set(first)
    assert first["primary_metric"] == "auc_pr" and 0.0 <= first["auc_pr"] <= 1.0
    # this installation's first model: it clears the floor (0) and becomes the champion
    assert (first["model_version"], first["previous_champion"], first["champion_auc_pr"]) == ("1", None, None)
    assert first["decision"] == decision_by_auc_pr(first["auc_pr"], None, policy) == "promoted", first
    assert first["champion_version"] == "1"
    steps = {"training_set", "train", "evaluate", "register", "promote", "export", "compress"}
    assert set(first["seconds_per_step"]) == steps and all(s > 0 for s in first["seconds_per_step"].values())
    import mlflow

    logged = mlflow.MlflowClient(get_settings().mlflow_tracking_uri).get_run(first["run_id"]).data.metrics
    assert {f"stage_seconds.{s}" for s in steps} <= set(logged)
    assert logged["stage_seconds.training_set"] == pytest.approx(first["seconds_per_step"]["training_set"])
    # the same training set, code, configuration and image again: nothing would change, so nothing trains
    code, same = _mlops("retrain", "--date", LAST.isoformat())
    assert code == 0, same
    assert (same["status"], same["identical"], same["model_version"]) == ("skipped", True, "1"), same
    assert same["training_set_rev"] == first["training_set_rev"] and "identical to v1" in same["reason"]
    assert "train" not in same["seconds_per_step"]
    skipped = mlflow.MlflowClient(get_settings().mlflow_tracking_uri).get_run(same["skip_run_id"]).data.tags
    assert skipped["retrain.skipped"] == "true" and skipped["retrain.identical_to_version"] == "1"
    # --force trains anyway: the checkpoint of these arguments is finished, so it resumes at the end
    code, second = _mlops("retrain", "--date", LAST.isoformat(), "--force")
    assert code == 0, second
    assert second["training_set_rev"] == first["training_set_rev"]
    assert second["resumed_from_step"] is not None
    # the same model scores the same on the same holdout: it cannot beat the champion, itself, by the margin
    assert second["auc_pr"] == second["champion_auc_pr"] == first["auc_pr"]
    assert second["decision"] == decision_by_auc_pr(second["auc_pr"], first["auc_pr"], policy) == "rejected"
    assert (second["model_version"], second["previous_champion"]) == ("2", "1")
    assert second["champion_version"] == first["champion_version"]

    # one champion so far: nothing to roll back to, and the champion stays
    code, history = _mlops("history")
    assert code == 0 and history["champion_version"] == "1"
    assert [h["decision"] for h in history["history"]] == ["promoted", "rejected"]
    code, rolled = _mlops("rollback", "--reason", "drill")
    assert code == 1 and rolled["status"] == "failed" and "no previous champion" in rolled["message"]
    code, again = _mlops("history")
    assert code == 0 and again["champion_version"] == "1" and len(again["history"]) == 2
    # a second champion (by hand, by a named person), then the rollback (by this machine's user, as the
    # command says) puts the first back
    code, by_hand = _mlops("promote", "--version", "2", "--reason", "drill", "--actor", "ops-lead")
    assert code == 0 and (by_hand["decision"], by_hand["champion_version"]) == ("promoted", "2"), by_hand
    assert by_hand["actor"] == "ops-lead" and "actor: ops-lead (--actor)" in by_hand["stderr"]
    code, rolled = _mlops("rollback", "--reason", "drill")
    assert code == 0 and (rolled["decision"], rolled["champion_version"]) == ("rolled_back", "1"), rolled
    me = getpass.getuser()
    assert rolled["actor"] == me and f"actor: {me} (this machine's user" in rolled["stderr"]
    code, after = _mlops("history")
    assert code == 0 and after["champion_version"] == "1"
    assert [h["decision"] for h in after["history"]] == ["promoted", "rejected", "promoted", "rolled_back"]
    # every move with its actor: the retrains' gate decisions by this command's user
    assert [h["decided_by"] for h in after["history"]] == [me, me, "ops-lead", me]
    assert after["alias"] == {"alias": "1", "recorded": "1", "out_of_band": False}

    # the alias moved with MLflow's own client, outside the history: `mlops history` says so
    mlflow.MlflowClient(get_settings().mlflow_tracking_uri).set_registered_model_alias(
        "fraud-detector", "champion", "2"
    )
    code, moved = _mlops("history")
    assert code == 0 and moved["champion_version"] == "1"
    assert moved["alias"] == {"alias": "2", "recorded": "1", "out_of_band": True}
    assert (
        "out of band: MLflow's champion alias points at v2, but the history's champion is v1"
        in moved["stderr"]
    )


def test_retrain_dag_skips_when_there_is_nothing_to_train_on(airflow_db):
    """A young installation (no silver yet, as when the weekly schedule fires before the first arrival):
    the run skips the training set and everything after it instead of failing, and says why."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    dag = DagBag(dag_folder="dags").dags["retrain_fraud_model"]
    run = dag.test(run_conf={"as_of": LAST.isoformat()})
    states = dag_run_states(run)
    with create_session() as session:
        reason = (
            session.query(XComModel.value)
            .filter(
                XComModel.run_id == run.run_id,
                XComModel.task_id == "training_set",
                XComModel.key == "skipped",
            )
            .scalar()
        )
    after = (
        "training_set",
        "skip_identical",
        "train",
        "evaluate",
        "register",
        "promote",
        "export",
        "compress",
        "ask_approval",
    )
    assert states == {"as_of_date": "success", **{task: "skipped" for task in after}}
    assert str(run.state) == "success"
    assert "no silver transactions yet" in str(reason)


def test_tune_dag_maps_its_trials_records_the_best_and_the_retrain_dag_trains_with_it(
    airflow_db, home, monkeypatch
):
    import mlflow
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    monkeypatch.setenv("MLOPS_TUNING__TRIALS", "3")
    monkeypatch.setenv("MLOPS_TUNING__EPOCHS", "2")
    get_settings.cache_clear()
    dag = DagBag(dag_folder="dags").dags["tune_fraud_model"]  # the trial count is mapped at parse time
    run = dag.test(run_conf={"as_of": LAST.isoformat()})
    with create_session() as session:
        instances = session.query(TaskInstance).filter(
            TaskInstance.run_id == run.run_id, TaskInstance.dag_id == "tune_fraud_model"
        )
        states = sorted((ti.task_id, ti.map_index, str(ti.state)) for ti in instances)
    assert states == [
        ("as_of_date", -1, "success"),
        ("finish_study", -1, "success"),
        ("start_study", -1, "success"),
        ("training_set", -1, "success"),
        *[("trial", slot, "success") for slot in range(3)],
    ]
    from training import tuning

    best = tuning.best_hyperparameters(get_settings())
    assert best is not None and best.study == f"fraud-mlp-{LAST.isoformat()}"

    retrain = DagBag(dag_folder="dags").dags["retrain_fraud_model"]
    retrained = retrain.test(run_conf={"as_of": LAST.isoformat()})
    client = mlflow.MlflowClient(get_settings().mlflow_tracking_uri)
    runs = client.search_runs(
        [client.get_experiment_by_name("fraud-detector").experiment_id],
        filter_string=f"tags.`lineage.dag_run_id` = '{retrained.run_id}'",
    )
    assert len(runs) == 1 and runs[0].data.tags["tuning.source"] == best.source
