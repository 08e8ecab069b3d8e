"""The approval DAG's helpers (dags/approve_fraud_model.py): what the approver is shown, and their answer
as the approve step takes it. The promotion history only (training/ledger.py, SQLAlchemy): the Airflow image
has no MLflow; moving the alias is the approve step's (training/steps.py approve)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

SHOWN = ("auc_pr", "roc_auc", "recall_at_1pct_fpr", "latency_ms_p50")


def pending_candidate(settings: Settings, version: str, card: str | None = None) -> dict[str, Any] | None:
    """The gate pass of `version` waiting for approval, with the approver's Markdown `body` (linking the
    version's model card `card`, where the gate step wrote it); None if none."""
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
        "body": approval_body(settings, waiting, card),
        "model_card": card,
    }


def approval_body(settings: Settings, waiting: Any, card: str | None = None) -> str:
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
    trusted = trusted_card(settings, card)
    if trusted and trusted.startswith(("http://", "https://")):
        lines.append(f"**Read its model card first**: [{trusted}]({trusted})")
    elif trusted:
        lines.append(f"**Read its model card first**: `{trusted}`")
    elif card:
        lines.append("(The request named a model card outside this installation's MLflow: not shown.)")
    uri = settings.mlflow_ui_url or settings.mlflow_tracking_uri
    if uri.startswith(("http://", "https://")):
        model = f"{uri.rstrip('/')}/#/models/fraud-detector/versions/{waiting.candidate_version}"
        lines.append(f"Its MLflow version, run and evaluation plots: [{model}]({model})")
    lines.append("Approve promotes it now; Reject, or no answer in time, promotes nothing.")
    return "\n".join(lines)


def trusted_card(settings: Settings, card: Any) -> str | None:
    """`card` when it is where this installation's cards are (its MLflow UI, or its MLflow folder in the
    local profile), else None: the link comes with an asset event, which anyone allowed to post one can
    write, and the approver is told to follow it."""
    import re

    if not isinstance(card, str) or len(card) > 2000 or re.search(r"[\s`<>()\[\]]", card):
        return None
    ui = (settings.mlflow_ui_url or settings.mlflow_tracking_uri).rstrip("/")
    if ui.startswith(("http://", "https://")):
        return (
            card
            if card.startswith(f"{ui}/#/experiments/") and card.endswith("/model_card/index.html")
            else None
        )
    root = str(settings.mlflow_dir)
    return card if card.startswith(f"{root}/") and card.endswith("/model_card/index.html") else None


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
