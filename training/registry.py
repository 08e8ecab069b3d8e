"""The MLflow model registry behind a small interface, and the champion/challenger gate.

The gate scores the candidate and the current champion on the same holdout, moves the alias `champion`
only if the candidate wins by the margin and passes the guardrails (or, with no champion yet, clears the
absolute floor), and appends every decision to the promotion history (training/ledger.py). The whole
read-decide-move-record step runs under the ledger's lock, so parallel candidates are decided in turn.
Rollback restores the champion before the current one, as the history replays it, and is recorded too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from core.errors import PipelineError
from training.ledger import Decision, Ledger, champion_stack
from training.metrics import PRIMARY_METRIC, evaluate

if TYPE_CHECKING:
    import torch

    from training.model import ModelConfig

MODEL_NAME = "fraud-detector"
CHAMPION_ALIAS = "champion"


class PromotionError(PipelineError):
    """A promotion or rollback that cannot be done; the message says why and what to do."""


@dataclass(frozen=True)
class GatePolicy:
    margin: float = 0.005  # AUC-PR the challenger must gain over the champion
    floor: float = 0.10  # AUC-PR the first champion needs
    max_roc_auc_drop: float = 0.02  # guardrails: secondary metrics may not regress more than this
    max_recall_drop: float = 0.05  # on recall at a 1% false-positive rate
    max_latency_ms: float = 20.0  # median scoring latency of one transaction, CPU


def gate_decision(
    candidate: dict[str, float],
    champion: dict[str, float] | None,
    latency_ms: float,
    policy: GatePolicy,
) -> tuple[bool, str]:
    """Whether the candidate should become champion, and why (pure; the reason names the numbers)."""
    score = candidate[PRIMARY_METRIC]
    if latency_ms > policy.max_latency_ms:
        return False, f"scoring latency {latency_ms:.2f} ms is above the bound {policy.max_latency_ms} ms"
    if champion is None:
        if score < policy.floor:
            return False, f"first model: AUC-PR {score:.4f} is below the floor {policy.floor}"
        return True, f"first model: AUC-PR {score:.4f} clears the floor {policy.floor}"
    best = champion[PRIMARY_METRIC]
    if score < best + policy.margin:
        return False, (
            f"AUC-PR {score:.4f} does not beat the champion's {best:.4f} by the margin {policy.margin}"
        )
    for metric, bound in (
        ("roc_auc", policy.max_roc_auc_drop),
        ("recall_at_1pct_fpr", policy.max_recall_drop),
    ):
        drop = champion[metric] - candidate[metric]
        if drop > bound:
            return False, (
                f"guardrail: {metric} falls by {drop:.4f} "
                f"({champion[metric]:.4f} -> {candidate[metric]:.4f}), "
                f"more than {bound}"
            )
    return (
        True,
        f"AUC-PR {score:.4f} beats the champion's {best:.4f} by {score - best:.4f} (margin {policy.margin})",
    )


class ModelRegistry:
    """The registered model's versions and its champion alias."""

    def __init__(self, tracking_uri: str, name: str = MODEL_NAME) -> None:
        from mlflow import MlflowClient

        self.tracking_uri = tracking_uri
        self.name = name
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    def register(self, run_id: str, artifact: str = "model", tags: dict[str, str] | None = None) -> str:
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_registered_model(self.name)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            try:
                self.client.create_registered_model(self.name, description="Card-transaction fraud scores")
            except MlflowException as race:  # another run created it in between
                if race.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
        import mlflow

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        # runs:/ resolves to the run's logged model (MLflow 3 keeps it apart from the run's artifacts)
        version = mlflow.register_model(f"runs:/{run_id}/{artifact}", self.name, tags=tags or {})
        return str(version.version)

    def champion(self) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version_by_alias(self.name, CHAMPION_ALIAS).version)
        except MlflowException as exc:
            if exc.error_code in {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}:
                return None
            raise

    def set_champion(self, version: str) -> None:
        self.client.set_registered_model_alias(self.name, CHAMPION_ALIAS, version)

    def load(self, version: str) -> torch.nn.Module:
        import mlflow.pytorch

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        model = mlflow.pytorch.load_model(f"models:/{self.name}/{version}", map_location="cpu")
        return model.eval()


def scoring_latency_ms(model: torch.nn.Module, row: torch.Tensor, repeats: int = 200) -> float:
    """Median CPU time of this thread to score one transaction with the eager model, on one torch thread.
    CPU time, not wall time: the gate must not reject a model because the machine (or another thread of
    this process holding the GIL) was busy while it measured; in a loaded demo process wall time read
    many times the CPU cost (measured: see docs/benchmarks.md)."""
    import torch

    model = model.to("cpu").eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    timings = []
    try:
        with torch.inference_mode():
            for _ in range(20):
                model(row)
            for _ in range(repeats):
                started = time.thread_time()
                model(row)
                timings.append(time.thread_time() - started)
    finally:
        torch.set_num_threads(threads)
    return float(np.median(timings) * 1000)


def _score(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    from training.loop import predict

    return predict(model.to("cpu"), x).numpy()


def promote_with_gate(
    registry: ModelRegistry,
    ledger: Ledger,
    candidate_version: str,
    holdout_x: torch.Tensor,
    holdout_y: np.ndarray,
    policy: GatePolicy,
    training_set_rev: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    holdout_weights: np.ndarray | None = None,
) -> Decision:
    """Decide candidate vs champion on the same holdout (rows weighted by `holdout_weights`, if given), move
    the alias if it wins, record the decision."""
    with ledger.exclusive(registry.name) as conn:
        champion = registry.champion()
        candidate_model = registry.load(candidate_version)
        candidate_metrics = evaluate(holdout_y, _score(candidate_model, holdout_x), weights=holdout_weights)
        latency = scoring_latency_ms(candidate_model, holdout_x[:1])
        candidate_metrics["latency_ms_p50"] = latency
        champion_metrics: dict[str, float] | None = None
        if champion == candidate_version:
            promoted, reason = False, f"version {candidate_version} is already the champion"
            champion_metrics = candidate_metrics
        elif champion is not None:
            champion_model = registry.load(champion)
            champion_inputs = tuple(getattr(champion_model.config, "inputs", ()))
            candidate_inputs = cast("ModelConfig", candidate_model.config).inputs  # a FraudMLP's config
            if champion_inputs != tuple(candidate_inputs):
                changed = sorted(set(champion_inputs) ^ set(candidate_inputs)) or ["(order)"]
                promoted, reason = (
                    False,
                    (
                        f"champion v{champion} takes other input columns than the candidate (differing: "
                        f"{', '.join(changed[:8])}): the gate cannot compare them; promote by hand with "
                        f"`mlops promote --version {candidate_version} --reason ...`"
                    ),
                )
            else:
                champion_metrics = evaluate(
                    holdout_y, _score(champion_model, holdout_x), weights=holdout_weights
                )
                promoted, reason = gate_decision(candidate_metrics, champion_metrics, latency, policy)
        else:
            promoted, reason = gate_decision(candidate_metrics, None, latency, policy)
        decision = ledger.append(
            conn,
            Decision(
                model_name=registry.name,
                action="gate",
                decision="promoted" if promoted else "rejected",
                reason=reason,
                candidate_version=candidate_version,
                champion_before=champion,
                champion_after=candidate_version if promoted else champion,
                candidate_metrics=candidate_metrics,
                champion_metrics=champion_metrics or {},
                training_set_rev=training_set_rev,
                dag_id=dag_id,
                run_id=run_id,
            ),
        )
        # Inside the transaction: if moving the alias fails, the history row is not committed either.
        if promoted:
            registry.set_champion(candidate_version)
        return decision


def promote_manually(registry: ModelRegistry, ledger: Ledger, version: str, reason: str) -> Decision:
    """Make `version` the champion without the gate (a person's decision, recorded with their reason)."""
    if not reason.strip():
        raise PromotionError("a manual promotion needs a reason (--reason); it is kept in the history")
    registry.client.get_model_version(registry.name, version)  # fails clearly if it does not exist
    with ledger.exclusive(registry.name) as conn:
        champion = registry.champion()
        decision = ledger.append(
            conn,
            Decision(
                model_name=registry.name,
                action="manual",
                decision="promoted",
                reason=reason,
                candidate_version=version,
                champion_before=champion,
                champion_after=version,
            ),
        )
        registry.set_champion(version)
        return decision


def rollback(registry: ModelRegistry, ledger: Ledger, reason: str = "rollback") -> Decision:
    """Put the previous champion back (as the history replays it) and record it."""
    with ledger.exclusive(registry.name) as conn:
        stack = champion_stack(ledger.history(registry.name, conn))
        current = registry.champion()
        if len(stack) < 2:
            raise PromotionError(
                f"no previous champion of {registry.name} to roll back to "
                f"(champions so far: {stack or 'none'})"
            )
        if current != stack[-1]:
            raise PromotionError(
                f"the alias {CHAMPION_ALIAS!r} points at v{current} but the history says v{stack[-1]}: "
                "it was moved outside `mlops`; set it back or promote with "
                "`mlops promote --version V --reason ...`"
            )
        target = stack[-2]
        decision = ledger.append(
            conn,
            Decision(
                model_name=registry.name,
                action="rollback",
                decision="rolled_back",
                reason=f"{reason}: v{current} -> v{target}",
                candidate_version=current,
                champion_before=current,
                champion_after=target,
            ),
        )
        registry.set_champion(target)
        return decision
