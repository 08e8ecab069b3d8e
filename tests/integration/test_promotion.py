"""The gate, rollback and history against a real MLflow registry (SQLite, and PostgreSQL for parallel
candidates), with real torch models: a trained one, a weaker one and an untrained (worse) one."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from tests.model.tensors import make_split
from training.artifacts import log_model
from training.dataset import NUMERIC_FEATURES
from training.ledger import Ledger
from training.loop import TrainConfig, train
from training.registry import (
    CHAMPION_ALIAS,
    GatePolicy,
    ModelRegistry,
    PromotionError,
    alias_state,
    promote_manually,
    promote_with_gate,
    rollback,
)

POLICY = GatePolicy(margin=0.01, floor=0.2, max_latency_ms=50.0)
POSTGRES = "postgresql+psycopg2://postgres@127.0.0.1:5432"


def _model(steps: int | None, seed: int, tmp: Path):
    """A FraudMLP trained for `steps` optimizer steps (None: 3 epochs; 0: untrained)."""
    from training.model import FraudMLP

    torch.manual_seed(seed)
    model = FraudMLP()
    data = make_split(8_000, seed=1)
    model.fit_normalization(data.x[:, : len(NUMERIC_FEATURES)])
    if steps != 0:
        config = TrainConfig(epochs=3, batch_size=256, seed=seed, stop_after_steps=steps)
        train(model, data, make_split(2_000, seed=2), config, tmp / f"ck-{seed}-{steps}", "promotion-test")
    return model.eval()


def _log_and_register(tracking_uri: str, artifacts: Path, model) -> str:
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    if mlflow.get_experiment_by_name("gate-test") is None:
        mlflow.create_experiment("gate-test", artifact_location=artifacts.as_uri())
    mlflow.set_experiment("gate-test")
    with mlflow.start_run() as run:
        log_model(model, name="model", pip_requirements=[])
    return ModelRegistry(tracking_uri).register(run.info.run_id)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    return {"good": _model(None, 5, tmp), "weaker": _model(12, 6, tmp), "untrained": _model(0, 7, tmp)}


@pytest.fixture(scope="module")
def holdout():
    data = make_split(4_000, seed=3)
    return data.x, data.y.numpy()


@pytest.fixture
def local_registry(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ledger = Ledger(f"sqlite:///{tmp_path / 'promotions.db'}")
    yield ModelRegistry(uri), ledger, tmp_path / "artifacts"
    ledger.dispose()


def _gate(registry, ledger, version, holdout):
    return promote_with_gate(
        registry, ledger, version, holdout[0], holdout[1], POLICY, dag_id="d", run_id="r"
    )


def test_worse_challenger_is_never_promoted_and_rollback_restores_the_previous_champion(
    local_registry, models, holdout
):
    registry, ledger, artifacts = local_registry
    weaker = _log_and_register(registry.tracking_uri, artifacts, models["weaker"])
    good = _log_and_register(registry.tracking_uri, artifacts, models["good"])
    untrained = _log_and_register(registry.tracking_uri, artifacts, models["untrained"])

    first = _gate(registry, ledger, weaker, holdout)
    assert first.promoted, first.reason
    assert registry.champion() == weaker

    better = _gate(registry, ledger, good, holdout)
    assert better.promoted, better.reason
    assert better.candidate_metrics["auc_pr"] > better.champion_metrics["auc_pr"] + POLICY.margin
    assert registry.champion() == good

    worse = _gate(registry, ledger, untrained, holdout)
    assert not worse.promoted
    assert "does not beat" in worse.reason
    assert registry.champion() == good
    assert worse.champion_metrics["auc_pr"] > worse.candidate_metrics["auc_pr"]

    back = rollback(registry, ledger, "incident 42", actor="on-call")
    assert (back.champion_before, back.champion_after) == (good, weaker)
    assert registry.champion() == weaker

    history = ledger.history(registry.name)
    assert [(h.action, h.decision, h.candidate_version) for h in history] == [
        ("gate", "promoted", weaker),
        ("gate", "promoted", good),
        ("gate", "rejected", untrained),
        ("rollback", "rolled_back", good),
    ]
    assert all(h.dag_id == "d" and h.run_id == "r" for h in history[:3])
    # every row carries its actor: the DAG run for the gate's own moves, the person for the rollback
    assert [h.decided_by for h in history] == ["dag d run r"] * 3 + ["on-call"]
    assert "incident 42" in history[-1].reason

    with pytest.raises(PromotionError, match="no previous champion"):
        rollback(registry, ledger)
    assert registry.champion() == weaker


def test_first_model_below_the_floor_is_not_promoted(local_registry, models, holdout):
    registry, ledger, artifacts = local_registry
    version = _log_and_register(registry.tracking_uri, artifacts, models["untrained"])
    decision = _gate(registry, ledger, version, holdout)
    assert not decision.promoted
    assert "below the floor" in decision.reason
    assert registry.champion() is None


def test_manual_promotion_needs_a_reason_and_is_recorded(local_registry, models):
    registry, ledger, artifacts = local_registry
    version = _log_and_register(registry.tracking_uri, artifacts, models["weaker"])
    with pytest.raises(PromotionError, match="needs a reason"):
        promote_manually(registry, ledger, version, " ")
    decision = promote_manually(registry, ledger, version, "hotfix approved by risk team", actor="ops-lead")
    assert registry.champion() == version
    row = ledger.history(registry.name)[-1]
    assert (row.reason, row.decided_by) == (decision.reason, "ops-lead")  # who moved it, with why


def test_rollback_refuses_when_the_alias_was_moved_behind_its_back(local_registry, models):
    registry, ledger, artifacts = local_registry
    one = _log_and_register(registry.tracking_uri, artifacts, models["weaker"])
    two = _log_and_register(registry.tracking_uri, artifacts, models["good"])
    promote_manually(registry, ledger, one, "first")
    promote_manually(registry, ledger, two, "second")
    assert alias_state(registry, ledger.history(registry.name)) == {
        "alias": two, "recorded": two, "out_of_band": False
    }  # fmt: skip
    registry.client.set_registered_model_alias(registry.name, CHAMPION_ALIAS, one)  # by hand, unrecorded
    with pytest.raises(PromotionError, match="moved outside"):
        rollback(registry, ledger)
    # what `mlops history` shows: the alias where the history never put it
    assert alias_state(registry, ledger.history(registry.name)) == {
        "alias": one, "recorded": two, "out_of_band": True
    }  # fmt: skip


def test_rollback_and_promotion_are_compare_and_swap_on_the_champion_they_name(local_registry, models):
    from training.registry import ChampionMovedError

    registry, ledger, artifacts = local_registry
    one = _log_and_register(registry.tracking_uri, artifacts, models["weaker"])
    two = _log_and_register(registry.tracking_uri, artifacts, models["good"])
    three = _log_and_register(registry.tracking_uri, artifacts, models["untrained"])
    promote_manually(registry, ledger, one, "first")
    promote_manually(registry, ledger, two, "second")
    promote_manually(registry, ledger, three, "a person's hotfix, landed after a monitor judged v2")

    with pytest.raises(
        ChampionMovedError, match=f"decided for champion v{two}, but the champion is now v{three}"
    ):
        rollback(registry, ledger, "monitor: v2 serves badly", expected_champion=two)
    with pytest.raises(ChampionMovedError, match="nothing was moved"):
        promote_manually(registry, ledger, one, "back to v1", expected_champion=two)
    assert registry.champion() == three
    refused = ledger.history(registry.name)[-2:]
    assert [(h.action, h.decision, h.champion_before, h.champion_after) for h in refused] == [
        ("rollback", "refused", three, three),
        ("manual", "refused", three, three),
    ]
    assert "monitor: v2 serves badly" in refused[0].reason

    back = rollback(registry, ledger, "the hotfix misbehaves", expected_champion=three)
    assert (back.champion_before, back.champion_after) == (three, two)  # refused rows replay as nothing
    assert registry.champion() == two


# --- parallel candidates on PostgreSQL ------------------------------------------------------------------


def _candidate(uri: str, version: str, barrier, results) -> None:
    holdout = make_split(4_000, seed=3)
    registry, ledger = ModelRegistry(uri), Ledger(uri)
    barrier.wait(timeout=120)
    decision = promote_with_gate(registry, ledger, version, holdout.x, holdout.y.numpy(), POLICY)
    results.put(decision.to_dict())
    ledger.dispose()


def test_parallel_candidates_leave_alias_and_history_consistent(postgres_database, models, holdout, tmp_path):
    uri = postgres_database
    registry, ledger = ModelRegistry(uri), Ledger(uri)
    versions = {
        name: _log_and_register(uri, tmp_path / "artifacts", models[name]) for name in ("weaker", "good")
    }
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    workers = [context.Process(target=_candidate, args=(uri, v, barrier, results)) for v in versions.values()]
    for worker in workers:
        worker.start()
    decisions = [results.get(timeout=300) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0

    history = ledger.history(registry.name)
    assert len(history) == 2
    first, second = history
    # decided one after the other: the second saw the first's outcome
    assert first.champion_before is None
    assert second.champion_before == first.champion_after
    assert registry.champion() == second.champion_after
    # whichever went first, the better model ends as champion
    assert registry.champion() == versions["good"]
    assert {d["candidate_version"] for d in decisions} == set(versions.values())
    with pytest.raises(sa.exc.DatabaseError, match="append-only"), ledger.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM promotion_history")
    ledger.dispose()


def test_gate_refuses_to_compare_with_a_champion_on_other_input_columns(local_registry, models, holdout):
    import copy
    import dataclasses

    registry, ledger, artifacts = local_registry
    renamed = copy.deepcopy(models["good"])
    inputs = list(renamed.config.inputs)
    inputs[0] = "a_feature_that_was_replaced"
    renamed.config = dataclasses.replace(renamed.config, inputs=tuple(inputs))
    old = _log_and_register(registry.tracking_uri, artifacts, renamed)
    promote_manually(registry, ledger, old, "before the feature change")
    new = _log_and_register(registry.tracking_uri, artifacts, models["good"])
    decision = _gate(registry, ledger, new, holdout)
    assert not decision.promoted
    assert "does not carry (a_feature_that_was_replaced)" in decision.reason, decision.reason
    assert decision.inputs_change == {
        "added": [models["good"].config.inputs[0]],
        "removed": ["a_feature_that_was_replaced"],
    }
    assert registry.champion() == old


def test_the_gate_judges_a_candidate_with_a_new_input_against_a_champion_without_it(
    local_registry, models, holdout
):
    """A feature was declared after the champion was trained: the candidate takes it, the champion does not.
    Both are scored on the same holdout rows, each with its own inputs by name (the champion's figures are
    its own model's on its own columns), and the decision records what the candidate added."""
    from training.metrics import evaluate
    from training.model import FraudMLP, ModelConfig

    registry, ledger, artifacts = local_registry
    new_feature = NUMERIC_FEATURES[5]
    own = [name for name in models["good"].config.inputs if name != new_feature]
    positions = [models["good"].config.inputs.index(name) for name in own]
    torch.manual_seed(11)
    older = FraudMLP(ModelConfig(numeric=len(NUMERIC_FEATURES) - 1, inputs=tuple(own)))
    data = make_split(8_000, seed=1)
    older.fit_normalization(data.x[:, positions][:, : len(NUMERIC_FEATURES) - 1])
    config = TrainConfig(epochs=3, batch_size=256, seed=11, stop_after_steps=12)
    without = make_split(2_000, seed=2)
    train(
        older,
        type(data)(data.x[:, positions], data.y),
        type(without)(without.x[:, positions], without.y),
        config,
        artifacts.parent / "ck-older",
        "promotion-test",
    )
    champion = _log_and_register(registry.tracking_uri, artifacts, older.eval())
    promote_manually(registry, ledger, champion, "trained before the feature was declared")
    candidate = _log_and_register(registry.tracking_uri, artifacts, models["good"])

    decision = _gate(registry, ledger, candidate, holdout)
    assert decision.inputs_change == {"added": [new_feature], "removed": []}
    assert f"added: {new_feature}; removed: none" in decision.reason
    with torch.no_grad():
        own_scores = older.eval()(holdout[0][:, positions]).numpy().reshape(-1)
    expected = evaluate(holdout[1], own_scores)["auc_pr"]
    assert decision.champion_metrics["auc_pr"] == pytest.approx(expected, abs=1e-6)
    assert decision.promoted, decision.reason  # 3 epochs against 12 steps: the gate's ordinary verdict
    assert registry.champion() == candidate
    recorded = ledger.history(registry.name)[-1]
    assert (recorded.id, recorded.inputs_change) == (decision.id, {"added": [new_feature], "removed": []})


def test_each_version_is_gated_at_its_own_threshold_and_a_moved_decline_rate_is_refused(
    local_registry, models, holdout
):
    """The operating points recorded at registration (model_contract/operating_point.py): the gate measures
    each side's decline rate at its own threshold on the same holdout transactions; a better AUC-PR whose
    threshold would change the decline rate past the bound is not promoted, and a point chosen for the same
    decline rate is."""
    from model_contract.operating_point import choose

    registry, ledger, artifacts = local_registry
    scores = {}
    for kind in ("weaker", "good"):
        with torch.no_grad():
            scores[kind] = models[kind](holdout[0]).numpy().reshape(-1)
    weaker = _log_and_register(registry.tracking_uri, artifacts, models["weaker"])
    point = choose(holdout[1], scores["weaker"], 0.05)
    for key, value in point.tags().items():
        registry.client.set_model_version_tag(registry.name, weaker, key, value)
    assert _gate(registry, ledger, weaker, holdout).promoted

    loose = _log_and_register(registry.tracking_uri, artifacts, models["good"])  # declines 20%
    for key, value in choose(holdout[1], scores["good"], 0.20).tags().items():
        registry.client.set_model_version_tag(registry.name, loose, key, value)
    refused = _gate(registry, ledger, loose, holdout)
    assert not refused.promoted and registry.champion() == weaker
    assert "moves by more than 2.00%" in refused.reason, refused.reason
    assert refused.candidate_metrics["decline_rate"] == pytest.approx(0.20, abs=0.005)
    assert refused.champion_metrics["threshold"] == point.threshold
    assert refused.champion_metrics["decline_rate"] == pytest.approx(0.05, abs=0.005)

    same = _log_and_register(registry.tracking_uri, artifacts, models["good"])  # the same 5%
    for key, value in choose(holdout[1], scores["good"], 0.05).tags().items():
        registry.client.set_model_version_tag(registry.name, same, key, value)
    kept = _gate(registry, ledger, same, holdout)
    assert kept.promoted, kept.reason
    assert "decline rate 5.00% -> 5.00% on the same transactions" in kept.reason
