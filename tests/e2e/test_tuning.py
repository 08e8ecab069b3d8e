"""`mlops tune` on the demo's stack, as a user runs it: the study goes through Airflow with its trials as
mapped tasks running two at a time, the best trial is recorded, and the next `mlops retrain` trains with
its parameters, says so, and still goes through the gate."""

from __future__ import annotations

import mlflow
import pytest

from tests.e2e.conftest import DEMO_DATES, mlops_json
from tests.gate_rule import decision_by_auc_pr
from training.registry import GatePolicy

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tuned(demo_stack) -> dict:
    return mlops_json(demo_stack, "tune", "--date", DEMO_DATES[-1].isoformat())


def test_the_study_ran_its_trials_as_parallel_mapped_tasks_and_recorded_the_best(tuned, demo_stack):
    assert tuned["status"] == "ok"
    trials = tuned["trials"]
    assert [t["slot"] for t in trials] == [0, 1, 2, 3]
    assert all(t["task_state"] == "success" for t in trials), trials
    assert tuned["most_trials_at_once"] == 2  # MLOPS_TUNING__PARALLELISM
    assert {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"}
    best = max((t for t in trials if t["state"] == "COMPLETE"), key=lambda t: t["value"])
    assert tuned["best_trial"] == best["trial"] and tuned["best_params"] == best["params"]

    client = mlflow.MlflowClient(demo_stack.mlflow_url)
    parent = client.get_run(tuned["parent_run_id"])
    assert parent.data.tags["tuning.study"] == tuned["study"]
    assert float(parent.data.metrics["best_validation_auc_pr"]) == pytest.approx(
        tuned["best_validation_auc_pr"]
    )
    for trial in trials:
        child = client.get_run(trial["mlflow_run_id"])
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id


def test_the_next_retrain_trains_with_the_best_trial_and_goes_through_the_gate(tuned, demo_stack):
    retrained = mlops_json(demo_stack, "retrain", "--date", DEMO_DATES[-1].isoformat(), "--epochs", "1")
    assert retrained["status"] == "ok"
    # the gate's rule on the AUC-PRs it recorded: this candidate against whichever version is champion now
    policy = GatePolicy(floor=float(demo_stack.env["MLOPS_GATE__FLOOR"]))
    expected = decision_by_auc_pr(retrained["auc_pr"], retrained["champion_auc_pr"], policy)
    assert retrained["decision"] == expected, retrained
    assert retrained["previous_champion"] is not None  # the demo made one
    assert retrained["champion_version"] == (
        retrained["model_version"] if expected == "promoted" else retrained["previous_champion"]
    )
    assert retrained["reason"]  # the gate said why, either way
    client = mlflow.MlflowClient(demo_stack.mlflow_url)
    run = client.get_run(retrained["run_id"])
    assert run.data.tags["tuning.source"].startswith(f"study {tuned['study']} trial {tuned['best_trial']} ")
    assert float(run.data.params["train.learning_rate"]) == pytest.approx(
        tuned["best_params"]["learning_rate"]
    )
    assert run.data.params["train.batch_size"] == str(tuned["best_params"]["batch_size"])
