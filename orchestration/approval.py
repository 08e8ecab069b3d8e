"""The approval DAG's helpers (dags/approve_fraud_model.py): what the approver is shown, and their answer
as the approve step takes it. The promotion history only (training/ledger.py, SQLAlchemy): the Airflow image
has no MLflow; moving the alias is the approve step's (training/steps.py approve)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

SHOWN = ("auc_pr", "roc_auc", "recall_at_1pct_fpr", "latency_ms_p50")


def pending_candidate(settings: Settings, version: str) -> dict[str, Any] | None:
    """The gate pass of `version` waiting for approval, with the approver's Markdown `body`; None if none."""
    from model_contract.onnx import MODEL_NAME
    from training.ledger import Ledger, pending_approval

    ledger = Ledger(settings.promotion_ledger_url)
    try:
        waiting = pending_approval(ledger.history(MODEL_NAME), version)
    finally:
        ledger.dispose()
    if waiting is None:
        return None
    return {
        "model_version": version,
        "champion_version": waiting.champion_before,
        "history_id": waiting.id,
        "triggered_by": waiting.triggered_by,
        "body": approval_body(settings, waiting),
    }


def approval_body(settings: Settings, waiting: Any) -> str:
    """The gate's figures, candidate against champion, and where to look further (Markdown)."""
    champion = waiting.champion_before
    rows = [
        f"| {name} | {waiting.candidate_metrics.get(name, float('nan')):.4f} | "
        + (f"{waiting.champion_metrics[name]:.4f} |" if name in waiting.champion_metrics else "- |")
        for name in SHOWN
        if name in waiting.candidate_metrics
    ]
    lines = [
        f"The gate passed **fraud-detector v{waiting.candidate_version}** "
        + (f"against champion **v{champion}**" if champion else "as the first champion")
        + (
            f" on the holdout of training set `{waiting.training_set_rev}`."
            if waiting.training_set_rev
            else "."
        ),
        "",
        f"> {waiting.reason}",
        "",
        f"| metric | v{waiting.candidate_version} | " + (f"v{champion} |" if champion else "champion |"),
        "|---|---|---|",
        *rows,
        "",
        f"Started by: {waiting.triggered_by or 'a schedule or an event'} (cannot approve it)."
        + (f" Retrain run: `{waiting.dag_id}` `{waiting.run_id}`." if waiting.run_id else ""),
    ]
    uri = settings.mlflow_ui_url or settings.mlflow_tracking_uri
    if uri.startswith(("http://", "https://")):
        model = f"{uri.rstrip('/')}/#/models/fraud-detector/versions/{waiting.candidate_version}"
        lines.append(f"Its MLflow version, run and evaluation plots: [{model}]({model})")
    lines.append("Approve promotes it now; Reject, or no answer in time, promotes nothing.")
    return "\n".join(lines)


def answer_of(ti: Any, dag_run: Any) -> dict[str, str]:
    """The approval task's answer (none when it timed out or failed) as the approve step's arguments."""
    from airflow.sdk.exceptions import AirflowSkipException

    asked = ti.xcom_pull(task_ids="candidate")
    if not asked:
        raise AirflowSkipException("nothing was asked: no candidate waiting for approval")
    answered = ti.xcom_pull(task_ids="approval") or {}
    chosen = answered.get("chosen_options") or [""]
    user = answered.get("responded_by_user") or {}
    return {
        "version": asked["model_version"],
        "choice": chosen[0],
        "decided_by": user.get("name") or user.get("id") or "",
        "comment": str((answered.get("params_input") or {}).get("comment") or ""),
        "started_by": getattr(dag_run, "triggering_user_name", None) or "",
    }
