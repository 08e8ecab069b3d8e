"""The MLflow model registry behind a small interface, and the champion/challenger gate.

The gate scores the candidate and the current champion on the same holdout, moves the alias `champion`
only if the candidate wins by the margin and passes the guardrails (or, with no champion yet, clears the
absolute floor), and appends every decision to the promotion history (training/ledger.py). The whole
read-decide-record-move step runs under the ledger's lock, so parallel candidates are decided in turn.
Rollback restores the champion before the current one, as the history replays it, and is recorded too.
The history is the source of truth: its row commits before the alias moves, and every promotion and
rollback first brings the alias in line with it (`sync_champion`), so a kill anywhere in between leaves
nothing the next one cannot finish.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from core.errors import PipelineError
from model_contract import operating_point
from model_contract.inputs import MODEL_INPUTS, MissingInputsError, input_positions, inputs_difference

# The names training writes and serving reads (model_contract.onnx), also this module's.
from model_contract.onnx import CHAMPION_ALIAS as CHAMPION_ALIAS
from model_contract.onnx import MODEL_NAME as MODEL_NAME
from model_contract.operating_point import OperatingPoint, decline_rate
from training.ledger import Decision, Ledger, champion_stack, pending_approval
from training.metrics import PRIMARY_METRIC, evaluate

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch


class PromotionError(PipelineError):
    """A promotion or rollback that cannot be done; the message says why and what to do."""


class ChampionMovedError(PromotionError):
    """A compare-and-swap promotion or rollback found another champion than the one it was decided on."""

    def __init__(self, action: str, expected: str | None, actual: str | None) -> None:
        self.action, self.expected, self.actual = action, expected, actual
        super().__init__(
            f"{action} refused: it was decided for champion v{expected}, but the champion is now v{actual} "
            "(another promotion or rollback landed since it was read); nothing was moved. Read the champion "
            "again (`mlops history`) and decide anew."
        )


class AliasMovedOutsideError(PromotionError):
    """The alias points where the promotion history never put it: someone moved it outside `mlops`."""

    def __init__(self, alias: str | None, recorded: str | None) -> None:
        self.alias, self.recorded = alias, recorded
        super().__init__(
            f"the alias {CHAMPION_ALIAS!r} points at v{alias} but the history says v{recorded}: "
            "it was moved outside `mlops`; set it back or promote with "
            "`mlops promote --version V --reason ...`"
        )


# What the gate adds to each side's metrics: its threshold (its operating point's, else the default) and the
# share of the holdout transactions it declines at it (model_contract/operating_point.py).
THRESHOLD, DECLINE_RATE = "threshold", "decline_rate"
OWN_THRESHOLD = "own_threshold"  # 1.0: the version's operating point's; 0.0: the default (serving.threshold)


@dataclass(frozen=True)
class GatePolicy:
    margin: float = 0.005  # AUC-PR the challenger must gain over the champion
    floor: float = 0.10  # AUC-PR the first champion needs
    max_roc_auc_drop: float = 0.02  # guardrails: secondary metrics may not regress more than this
    max_recall_drop: float = 0.05  # on recall at a 1% false-positive rate
    max_latency_ms: float = 20.0  # median scoring latency of one transaction, CPU
    max_decline_rate_change: float = 0.02  # decline rates at each one's own threshold, same transactions
    target_decline_rate: float | None = None  # training.decline_rate: a bigger move toward it is allowed


def gate_decision(
    candidate: dict[str, float],
    champion: dict[str, float] | None,
    latency_ms: float,
    policy: GatePolicy,
) -> tuple[bool, str]:
    """Whether the candidate should become champion, and why (pure; the reason names the numbers).

    A metric that is not a finite number (a diverged model scores NaN) is refused on either side: every
    comparison with NaN is false, so the rules below would otherwise let it through."""
    compared = (PRIMARY_METRIC, "roc_auc", "recall_at_1pct_fpr")
    for side, values in (("candidate", candidate), ("champion", champion or {})):
        broken = {m: values[m] for m in compared if m in values and not math.isfinite(values[m])}
        if broken:
            listed = ", ".join(f"{m} {v}" for m, v in broken.items())
            fix = (
                "retrain it (its scores are not finite numbers)"
                if side == "candidate"
                else "promote a working version by hand (`mlops promote --version V --reason ...`)"
            )
            return False, f"the {side}'s holdout metrics are not finite ({listed}): not comparable; {fix}"
    if not math.isfinite(latency_ms):
        return False, f"scoring latency {latency_ms} ms is not a finite number"
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
    gain = score - best
    beats = f"AUC-PR {score:.4f} beats the champion's {best:.4f} by {gain:.4f} (margin {policy.margin})"
    if DECLINE_RATE in candidate and DECLINE_RATE in champion:
        before, after = champion[DECLINE_RATE], candidate[DECLINE_RATE]
        moved = (
            f"decline rate {before:.2%} -> {after:.2%} on the same transactions, each at its own threshold "
            f"({champion.get(THRESHOLD, float('nan')):.4f} -> {candidate.get(THRESHOLD, float('nan')):.4f})"
        )
        # Bound for a candidate with an operating point of its own (the retrain pipeline records one); one
        # without decides at the operator's global threshold, as versions did before: reported, not bound.
        bound = candidate.get(OWN_THRESHOLD, 1.0) == 1.0
        target = policy.target_decline_rate
        if bound and not (abs(after - before) <= policy.max_decline_rate_change):  # NaN refused too
            # A big move back toward the stated target (a champion whose threshold went stale on today's
            # traffic) is what the operating point is for; one elsewhere (a changed target, edited tags) is a
            # decision for a person.
            if target is not None and abs(after - target) < abs(before - target):
                return True, f"{beats}; {moved}, back toward the target of {target:.2%}"
            return False, (
                f"{beats}, but the {moved} moves by more than {policy.max_decline_rate_change:.2%}"
                + (f", not toward the target of {target:.2%}" if target is not None else "")
                + ": promote by hand if the new decline rate is meant "
                "(`mlops promote --version V --reason ...`)"
            )
        return True, f"{beats}; {moved}"
    return True, beats


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

    def version(self, version: str):
        """The registered version `version` (MLflow's ModelVersion), or a LookupError naming the model, the
        version and the registry."""
        from mlflow.exceptions import MlflowException

        try:
            return self.client.get_model_version(self.name, version)
        except MlflowException as exc:
            raise LookupError(
                f"{self.name} has no version {version!r} in {self.tracking_uri}: `mlops history` lists them"
            ) from exc

    def trained_on(self, revisions: set[str]) -> list[dict[str, str | list[str]]]:
        """The versions whose training set (their `lineage.training_set_rev` tag) is one of `revisions`,
        oldest first: version, training set, run and aliases (an erasure's report names them)."""
        from mlflow.exceptions import MlflowException

        try:
            versions = self.client.search_model_versions(f"name = '{self.name}'")
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return []
            raise
        # search_model_versions leaves the aliases out: the registered model has them
        aliases = self.client.get_registered_model(self.name).aliases if versions else {}
        found: list[dict[str, str | list[str]]] = [
            {
                "version": str(v.version),
                "training_set_rev": (v.tags or {})["lineage.training_set_rev"],
                "run_id": str(v.run_id),
                "aliases": sorted(a for a, number in aliases.items() if str(number) == str(v.version)),
            }
            for v in versions
            if (v.tags or {}).get("lineage.training_set_rev") in revisions
        ]
        return sorted(found, key=lambda v: int(str(v["version"])))

    def champion(self) -> str | None:
        from mlflow.exceptions import MlflowException

        try:
            return str(self.client.get_model_version_by_alias(self.name, CHAMPION_ALIAS).version)
        except MlflowException as exc:
            if exc.error_code in {"RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"}:
                return None
            raise

    def operating_point(self, version: str) -> OperatingPoint | None:
        """The threshold (and what it was chosen for) recorded on the version at training; None if none."""
        return operating_point.from_tags(self.client.get_model_version(self.name, version).tags)

    def decision_threshold(self, version: str, default: float) -> float:
        """Where the service declines for `version`: its operating point's threshold, else `default`
        (`serving.threshold`), as serving/models.py decides."""
        point = self.operating_point(version)
        return point.threshold if point is not None else default

    def set_champion(self, version: str) -> None:
        self.client.set_registered_model_alias(self.name, CHAMPION_ALIAS, version)

    def load(self, version: str) -> torch.nn.Module:
        """The version's FraudMLP on CPU, from its weights and config: a pickled artifact is refused
        (training/artifacts.py), never unpickled."""
        import mlflow

        from training.artifacts import load_model

        mlflow.set_tracking_uri(self.tracking_uri)
        mlflow.set_registry_uri(self.tracking_uri)
        return load_model(f"models:/{self.name}/{version}")


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


def score_holdout(model: torch.nn.Module, x: np.ndarray) -> np.ndarray:
    """A version's scores of the float32 rows of `x` (its own inputs, in its order)."""
    import torch

    return _score(model, torch.from_numpy(np.ascontiguousarray(x, dtype="float32")))


def _score(model: torch.nn.Module, x: torch.Tensor) -> np.ndarray:
    from training.loop import predict

    return predict(model.to("cpu"), x).numpy()


def model_inputs_of(model: torch.nn.Module) -> tuple[str, ...]:
    """The input names a registered model was trained on (its config's; MODEL_INPUTS for a model that
    records none)."""
    return tuple(getattr(getattr(model, "config", None), "inputs", None) or MODEL_INPUTS)


def promote_with_gate(
    registry: ModelRegistry,
    ledger: Ledger,
    candidate_version: str,
    holdout_x: torch.Tensor | None,
    holdout_y: np.ndarray,
    policy: GatePolicy,
    training_set_rev: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    holdout_weights: np.ndarray | None = None,
    require_approval: bool = False,
    triggered_by: str | None = None,
    holdout_matrix: Callable[[tuple[str, ...], str], np.ndarray] | None = None,
    actor: str | None = None,
    default_threshold: float = 0.5,
) -> Decision:
    """Decide candidate vs champion on the same holdout (rows weighted by `holdout_weights`, if given),
    record the decision, move the alias if it wins. Each is scored with its own inputs, by name: the
    holdout's values of the names it was trained on (`holdout_matrix(inputs, who)`, e.g. Holdout.matrix;
    without it, `holdout_x` holds MODEL_INPUTS and each takes its columns of it). When their inputs differ
    the decision records what the candidate added and removed (`inputs_change`); a champion that takes an
    input the holdout does not carry cannot be compared, and the candidate is not promoted by the gate.
    Refuses (AliasMovedOutsideError) while the alias points where the history never put it: the gate would
    compare against a champion nobody recorded. With `require_approval`, a win is recorded as
    `awaiting_approval` and moves nothing: a person decides (decide_approval); `triggered_by`, the person
    who started the run, may not be that person. The row's actor (`decided_by`): `actor`, else the DAG run
    (`run_actor`). Each side's decline rate on the holdout is measured at its own threshold (its version's
    operating point, else `default_threshold`: `serving.threshold`) and compared (GatePolicy)."""
    import torch

    def declines(version: str, scores: np.ndarray) -> dict[str, float]:
        point = registry.operating_point(version)
        threshold = point.threshold if point is not None else default_threshold
        return {
            THRESHOLD: threshold,
            DECLINE_RATE: decline_rate(scores, threshold, holdout_weights),
            OWN_THRESHOLD: float(point is not None),
        }

    def matrix(inputs: tuple[str, ...], who: str) -> torch.Tensor:
        if holdout_matrix is not None:
            return torch.from_numpy(holdout_matrix(inputs, who))
        assert holdout_x is not None, "the holdout as a MODEL_INPUTS tensor or as holdout_matrix"
        return (
            holdout_x if inputs == MODEL_INPUTS else holdout_x[:, input_positions(inputs, MODEL_INPUTS, who)]
        )

    with ledger.exclusive(registry.name) as conn:
        champion = sync_champion(registry, ledger, conn)
        candidate_model = registry.load(candidate_version)
        candidate_inputs = model_inputs_of(candidate_model)
        candidate_x = matrix(candidate_inputs, f"candidate v{candidate_version}")
        candidate_scores = _score(candidate_model, candidate_x)
        candidate_metrics = evaluate(holdout_y, candidate_scores, weights=holdout_weights)
        candidate_metrics |= declines(candidate_version, candidate_scores)
        latency = scoring_latency_ms(candidate_model, candidate_x[:1])
        candidate_metrics["latency_ms_p50"] = latency
        champion_metrics: dict[str, float] | None = None
        inputs_change: dict | None = None
        if champion == candidate_version:
            promoted, reason = False, f"version {candidate_version} is already the champion"
            champion_metrics = candidate_metrics
        elif champion is not None:
            champion_model = registry.load(champion)
            champion_inputs = model_inputs_of(champion_model)
            change = inputs_difference(champion_inputs, candidate_inputs)
            inputs_change = change if change["added"] or change["removed"] else None
            try:
                champion_x = matrix(champion_inputs, f"champion v{champion}")
            except MissingInputsError as exc:
                promoted, reason = (
                    False,
                    (
                        f"champion v{champion} takes input(s) the candidate's holdout does not carry "
                        f"({', '.join(exc.missing[:8])}): the gate cannot score both on the same "
                        f"transactions; promote by hand with `mlops promote --version {candidate_version} "
                        "--reason ...`"
                    ),
                )
            else:
                champion_scores = _score(champion_model, champion_x)
                champion_metrics = evaluate(holdout_y, champion_scores, weights=holdout_weights)
                champion_metrics |= declines(champion, champion_scores)
                promoted, reason = gate_decision(candidate_metrics, champion_metrics, latency, policy)
            if inputs_change:
                added, removed = (", ".join(change[k]) or "none" for k in ("added", "removed"))
                reason = (
                    f"{reason}; inputs differ from champion v{champion}'s (added: {added}; removed: "
                    f"{removed}), each scored with its own on the same holdout transactions"
                )
        else:
            promoted, reason = gate_decision(candidate_metrics, None, latency, policy)
        waits = promoted and require_approval
        decision = _record(
            registry,
            ledger,
            conn,
            Decision(
                model_name=registry.name,
                action="gate",
                decision="awaiting_approval" if waits else "promoted" if promoted else "rejected",
                reason=f"{reason}; waiting for a person's approval" if waits else reason,
                candidate_version=candidate_version,
                champion_before=champion,
                champion_after=candidate_version if promoted and not waits else champion,
                candidate_metrics=candidate_metrics,
                champion_metrics=champion_metrics or {},
                training_set_rev=training_set_rev,
                dag_id=dag_id,
                run_id=run_id,
                triggered_by=triggered_by,
                decided_by=actor or run_actor(dag_id, run_id),
                inputs_change=inputs_change,
            ),
        )
        return decision


def decide_approval(
    registry: ModelRegistry,
    ledger: Ledger,
    version: str,
    approved: bool,
    decided_by: str | None,
    comment: str = "",
    started_by: tuple[str | None, ...] = (),
    dag_id: str | None = None,
    run_id: str | None = None,
    approvers: tuple[str, ...] = (),
) -> Decision:
    """A person's decision on a gate pass waiting for approval, recorded with who and why. Approval is a
    compare-and-swap on the champion the gate compared with: promoted only if it is still the champion
    (else `refused`, ChampionMovedError). Refused (PromotionError) as well when the approver started the
    run that asked, or the approval run (`started_by`, with the gate row's `triggered_by`): model-risk
    rules want an independent sign-off; and, with an approvers group (`approvers`), when the approver is not
    in it. A rejection or a timeout (`decided_by` None) promotes nothing."""
    with ledger.exclusive(registry.name) as conn:
        champion = sync_champion(registry, ledger, conn)
        waiting = pending_approval(ledger.history(registry.name, conn), version)
        if waiting is None:
            raise PromotionError(
                f"v{version} has no gate pass waiting for approval (`mlops history` shows its decisions); "
                "put it through the gate again (`mlops promote --version ... --gate`) to ask anew"
            )
        starters = {s for s in (waiting.triggered_by, *started_by) if s}
        row = Decision(
            model_name=registry.name,
            action="approval",
            decision="rejected",
            reason="",
            candidate_version=version,
            champion_before=champion,
            champion_after=champion,
            candidate_metrics=waiting.candidate_metrics,
            champion_metrics=waiting.champion_metrics,
            training_set_rev=waiting.training_set_rev,
            dag_id=dag_id,
            run_id=run_id,
            triggered_by=waiting.triggered_by,
            decided_by=decided_by,
            comment=comment or None,
        )
        said = f" ({comment})" if comment else ""
        not_allowed = None
        if approved and approvers and decided_by not in approvers:
            not_allowed = (
                f"{decided_by or 'an unnamed user'} is not in the approvers group ({', '.join(approvers)}: "
                "approval.approvers) and cannot approve it; one of them must (nothing was promoted)"
            )
        elif approved and decided_by in starters:
            not_allowed = (
                f"{decided_by} started the run that asked for this approval and cannot approve it: an "
                "independent sign-off is required; another person must approve (nothing was promoted)"
            )
        if not_allowed is not None:
            ledger.append(conn, replace(row, decision="refused", reason=not_allowed))
            ledger.commit(conn)
            raise PromotionError(not_allowed)
        if approved and champion != waiting.champion_before:
            moved = ChampionMovedError("approval", waiting.champion_before, champion)
            ledger.append(
                conn, replace(row, decision="refused", reason=f"approved by {decided_by}{said} [{moved}]")
            )
            ledger.commit(conn)
            raise moved
        if not approved:
            who = f"rejected by {decided_by}" if decided_by else "no decision in time"
            return _record(
                registry, ledger, conn, replace(row, reason=f"{who}{said}; the gate said: {waiting.reason}")
            )
        return _record(
            registry,
            ledger,
            conn,
            replace(
                row,
                decision="promoted",
                champion_after=version,
                reason=f"approved by {decided_by}{said}; the gate said: {waiting.reason}",
            ),
        )


def promote_manually(
    registry: ModelRegistry,
    ledger: Ledger,
    version: str,
    reason: str,
    expected_champion: str | None = None,
    actor: str | None = None,
) -> Decision:
    """Make `version` the champion without the gate (a person's decision, recorded with their reason and,
    as `decided_by`, `actor`: who they are).
    This is also the way out when the alias was moved outside `mlops`: it goes ahead, and the row notes
    where the alias was. With `expected_champion`, a compare-and-swap: refused (ChampionMovedError,
    recorded as a `refused` row) when the champion is another one by the time the lock is held."""
    if not reason.strip():
        raise PromotionError("a manual promotion needs a reason (--reason); it is kept in the history")
    registry.client.get_model_version(registry.name, version)  # fails clearly if it does not exist
    with ledger.exclusive(registry.name) as conn:
        try:
            champion = sync_champion(registry, ledger, conn)
        except AliasMovedOutsideError as moved:
            champion = moved.alias
            reason += f" [the alias was at v{moved.alias} outside mlops; the history said v{moved.recorded}]"
            log.warning("manual promotion over a moved alias: %s", moved)
        if expected_champion is not None and champion != expected_champion:
            _refuse(registry, ledger, conn, "manual", version, reason, expected_champion, champion)
        return _record(
            registry,
            ledger,
            conn,
            Decision(
                model_name=registry.name,
                action="manual",
                decision="promoted",
                reason=reason,
                candidate_version=version,
                champion_before=champion,
                champion_after=version,
                decided_by=actor,
            ),
        )


def rollback(
    registry: ModelRegistry,
    ledger: Ledger,
    reason: str = "rollback",
    expected_champion: str | None = None,
    dag_id: str | None = None,
    run_id: str | None = None,
    actor: str | None = None,
) -> Decision:
    """Put the previous champion back (as the history replays it) and record it, with `actor` (else the DAG
    run) as the row's `decided_by`. Refuses while the alias
    points where the history never put it (AliasMovedOutsideError). With `expected_champion` (what a
    monitor judged), a compare-and-swap: when another version is champion by the time the lock is held
    (a promotion landed meanwhile), nothing moves; the refusal is recorded and raised (ChampionMovedError)."""
    with ledger.exclusive(registry.name) as conn:
        current = sync_champion(registry, ledger, conn)
        if expected_champion is not None and current != expected_champion:
            _refuse(registry, ledger, conn, "rollback", expected_champion, reason, expected_champion, current)
        stack = champion_stack(ledger.history(registry.name, conn))
        if len(stack) < 2:
            raise PromotionError(
                f"no previous champion of {registry.name} to roll back to "
                f"(champions so far: {stack or 'none'})"
            )
        target = stack[-2]
        return _record(
            registry,
            ledger,
            conn,
            Decision(
                model_name=registry.name,
                action="rollback",
                decision="rolled_back",
                reason=f"{reason}: v{current} -> v{target}",
                candidate_version=current,
                champion_before=current,
                champion_after=target,
                dag_id=dag_id,
                run_id=run_id,
                decided_by=actor or run_actor(dag_id, run_id),
            ),
        )


def run_actor(dag_id: str | None, run_id: str | None) -> str | None:
    """The actor of a move a DAG run made on its own (the gate, a monitor's rollback)."""
    if not dag_id:
        return None
    return f"dag {dag_id} run {run_id}" if run_id else f"dag {dag_id}"


def alias_state(registry: ModelRegistry, history: list[Decision]) -> dict:
    """Where the champion alias points against the champion the history replays: `out_of_band` when the
    alias was moved (or removed) outside the history, by MLflow's client or UI. Read-only: what to do about
    it is `mlops promote` (a person's decision, recorded) or moving the alias back."""
    stack = champion_stack(history)
    recorded = stack[-1] if stack else None
    alias = registry.champion()
    return {"alias": alias, "recorded": recorded, "out_of_band": alias != recorded}


def version_label(version: str | None) -> str:
    return f"v{version}" if version else "none"


def alias_mismatch(state: dict) -> str:
    """What an `alias_state` that is out of band means, in one sentence (`mlops history`, the monitor's
    note and alert)."""
    return (
        f"MLflow's champion alias points at {version_label(state['alias'])}, but the history's champion is "
        f"{version_label(state['recorded'])}: it was moved outside `mlops` (MLflow's client or UI), or a "
        "move was interrupted"
    )


def _refuse(
    registry: ModelRegistry,
    ledger: Ledger,
    conn,
    action: str,
    candidate: str | None,
    reason: str,
    expected: str | None,
    actual: str | None,
) -> None:
    """Record a compare-and-swap that found another champion (decision `refused`, nothing moves) and raise."""
    error = ChampionMovedError(action, expected, actual)
    ledger.append(
        conn,
        Decision(
            model_name=registry.name,
            action=action,
            decision="refused",
            reason=f"{reason} [{error}]",
            candidate_version=candidate,
            champion_before=actual,
            champion_after=actual,
        ),
    )
    ledger.commit(conn)
    raise error


# --- the alias follows the history ----------------------------------------------------------------------

# Registered-model tag: the id of the history row the alias was last moved for (written after the move).
APPLIED_TAG = "mlops.champion_history_id"
# Fault injection for the crash tests: MLOPS_PROMOTION_KILL_AT=<point> SIGKILLs the process there, as an
# OOM kill or a lost node would. Points: appended (row written, not committed), committed (row committed,
# alias not moved), alias-moved (alias moved, APPLIED_TAG not yet written).
KILL_AT_ENV = "MLOPS_PROMOTION_KILL_AT"
_MOVES = frozenset({"promoted", "rolled_back"})  # decisions that move the alias

log = logging.getLogger(__name__)


def sync_champion(
    registry: ModelRegistry, ledger: Ledger, conn, moving: Decision | None = None
) -> str | None:
    """Bring the alias in line with the promotion history and return the champion. Call it under
    `ledger.exclusive(registry.name)` (`conn`).

    A promotion or rollback commits its history row, then moves the alias, then sets APPLIED_TAG to the
    row's id. With R the last row that moved the champion, the disagreements this can meet are:
    - alias == the champion the history replays: agreement; a kill between the alias move and the tag
      left the tag behind, and it is brought up to R.
    - alias == R.champion_before while the tag is older than R (or absent and R is the first move ever):
      our own kill between the commit and the alias move. The move is finished here, logged.
    - anything else: the alias was moved (or removed) outside `mlops`, to something the history never
      recorded. Among these, alias == R.champion_before with the tag at R: R's move was done, and a person
      set the alias back by hand. AliasMovedOutsideError: the history is not rewritten to fit, and the
      alias is not moved back over a person's decision; they set it back or `mlops promote` it.
    A history from before this tag (none on the model) counts as applied once alias and history agree.
    `moving`: the row the caller just committed, whose move is the expected one (logged as such)."""
    history = ledger.history(registry.name, conn)
    stack = champion_stack(history)
    recorded = stack[-1] if stack else None
    alias = registry.champion()
    moves = [row for row in history if row.decision in _MOVES]
    last = moves[-1] if moves else None
    if last is None:
        if alias != recorded:
            raise AliasMovedOutsideError(alias, recorded)
        return recorded
    applied = _applied_row(registry)
    if alias == recorded:
        if applied != last.id:
            _mark_applied(registry, last)
        return recorded
    assert last.id is not None, "rows read back from the ledger have their id"
    unfinished = alias == last.champion_before and (
        last.id > applied if applied is not None else len(moves) == 1
    )
    if not unfinished or recorded is None:
        raise AliasMovedOutsideError(alias, recorded)
    interrupted = moving is None or moving.id != last.id
    log.log(
        logging.WARNING if interrupted else logging.INFO,
        "%shistory row %s (%s of v%s): the alias %r moves from v%s to v%s",
        "finishing an interrupted move, " if interrupted else "",
        last.id, last.action, last.candidate_version, CHAMPION_ALIAS, alias, recorded,
    )  # fmt: skip
    registry.set_champion(recorded)
    _kill_point("alias-moved")
    _mark_applied(registry, last)
    return recorded


def _record(registry: ModelRegistry, ledger: Ledger, conn, decision: Decision) -> Decision:
    """Append the decision and commit it, then move the alias to what the history now says."""
    recorded = ledger.append(conn, decision)
    _kill_point("appended")
    ledger.commit(conn)
    _kill_point("committed")
    if recorded.decision in _MOVES:
        from mlflow.exceptions import MlflowException

        try:
            sync_champion(registry, ledger, conn, moving=recorded)  # re-reads: another may have run since
        except MlflowException as exc:
            raise PromotionError(
                f"history row {recorded.id} ({recorded.decision} v{recorded.champion_after}) is committed, "
                f"but moving the alias {CHAMPION_ALIAS!r} failed: {exc}. The next promotion, rollback or "
                "gate run finishes the move."
            ) from exc
    return recorded


def _applied_row(registry: ModelRegistry) -> int | None:
    tag = registry.client.get_registered_model(registry.name).tags.get(APPLIED_TAG)
    return None if tag is None else int(tag)


def _mark_applied(registry: ModelRegistry, row: Decision) -> None:
    registry.client.set_registered_model_tag(registry.name, APPLIED_TAG, str(row.id))


def _kill_point(point: str) -> None:
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)
