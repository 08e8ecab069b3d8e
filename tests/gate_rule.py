"""The gate's rule on the primary metric (training/registry.py, gate_decision), restated for the tests that
read a decision back: from the AUC-PRs the gate recorded, the decision it had to make."""

from __future__ import annotations

from training.registry import GatePolicy


def decision_by_auc_pr(auc_pr: float, champion_auc_pr: float | None, policy: GatePolicy) -> str:
    """'promoted' when the candidate clears the floor (no champion yet) or beats the champion by the margin,
    'rejected' otherwise. The guardrails and the latency bound may still reject a candidate this promotes;
    the tests compare it with the recorded decision exactly, so such a rejection fails them and is seen."""
    if champion_auc_pr is None:
        return "promoted" if auc_pr >= policy.floor else "rejected"
    return "promoted" if auc_pr >= champion_auc_pr + policy.margin else "rejected"
