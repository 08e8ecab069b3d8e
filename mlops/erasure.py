"""The erase_customer DAG's two steps around its approval (dags/erase_customer.py): the request checked and
put to the approvers, then the erasure, only on an approval by someone other than the run's starter."""

from __future__ import annotations

from typing import Any

ERASE, REFUSE = "Erase", "Refuse"


def erasure_request(customer: str, request: str, rebuild: bool, started_by: str) -> dict[str, Any]:
    """The request as the approvers read it; a ValueError naming the id when it is not one."""
    from pipelines.privacy import customer_id

    try:
        customer = customer_id(customer)
    except ValueError as exc:
        raise ValueError(f"the `customer` param: {exc}; trigger the DAG again with the id") from None
    gold = (
        "then gold, its DVC revisions, the online store and the training rows are rebuilt from what is left"
        if rebuild
        else "gold is left for a later `mlops features backfill` (rebuild off)"
    )
    body = (
        f"Erase customer **{customer}** ({request or 'no request reference given'}), asked by "
        f"{started_by or 'an unnamed user'}: the scoring service (every replica) forgets them, and their "
        f"rows leave landing, the quarantine, bronze, silver (their chargebacks too), the scoring log and "
        f"the online store; {gold}. The DVC revisions and model "
        "versions that still hold them are named in the report and leave with their retention. This cannot "
        "be undone."
    )
    return {
        "customer": customer,
        "request": request,
        "rebuild": rebuild,
        "started_by": started_by,
        "body": body,
    }


def erase_if_approved(asked: dict[str, Any] | None, answered: dict[str, Any] | None) -> dict[str, Any]:
    """Run the erasure when the approval chose Erase and was given by an approver other than the run's
    starter; skip (a refusal, no answer) or fail (the starter approving their own request) otherwise."""
    from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

    from core.settings import get_settings
    from mlops.chain import erase

    if not asked:
        raise AirflowSkipException("nothing was asked: the request did not pass its check")
    answered = answered or {}
    chosen = answered.get("chosen_options") or []
    user = answered.get("responded_by_user") or {}
    decided_by = str(user.get("name") or user.get("id") or "")
    if chosen != [ERASE]:
        why = f"refused by {decided_by}" if chosen else "no answer in time"
        raise AirflowSkipException(f"{why}: nothing was erased")
    settings = get_settings()
    if asked["started_by"] and decided_by == asked["started_by"]:
        raise AirflowFailException(
            f"{decided_by} asked for this erasure and cannot approve it too: nothing was erased; another "
            "approver answers a new run"
        )
    approvers = settings.approval.approvers
    if approvers and decided_by not in approvers:
        raise AirflowFailException(
            f"{decided_by} is not in the approvers group {approvers}: nothing was erased"
        )
    report = erase(settings, asked["customer"], rebuild=asked["rebuild"])
    comment = str((answered.get("params_input") or {}).get("comment") or "")
    return {**report, "request": asked["request"], "decided_by": decided_by, "comment": comment}
