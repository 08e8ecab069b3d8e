"""Alerts: what a person must hear about, sent to a webhook (a JSON POST) and by email, as the settings say
(`alerts.webhook_url`, `alerts.email_to`, core/settings.py AlertSettings).

Kinds: `task_failed` (any DAG task's last try, through orchestration/alerts.py's Airflow notifier), `drift`,
`rollback`, `rollback_refused`, `label_lag` (a check withheld its verdict: the chargebacks are late or
partial), `estimate_drop` (the label-free performance estimate fell), `estimate_unreliable` (the scores imply
a fraud rate far from the holdout's), `service` (the scoring service missed an objective),
`approval_requested` (a gate pass waits for a person's sign-off: to the approvers), `alias_out_of_band`
(MLflow's champion alias points where the promotion history never put it), `erasure_requested` (an
erasure waits for an approver: the request's reference, never the id). Sending never
raises: a channel that fails is logged with the reason and reported in the result, and the pipeline goes
on; an alert is bounded (its text to MAX_TEXT characters).

Only the standard library: the Airflow image and the training image both send.
"""

from __future__ import annotations

import json
import logging
import smtplib
import ssl
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings

log = logging.getLogger(__name__)

KINDS = (
    "task_failed",
    "drift",
    "rollback",
    "rollback_refused",
    "label_lag",
    "estimate_drop",
    "estimate_unreliable",
    "service",
    "approval_requested",
    "alias_out_of_band",
    "erasure_requested",
)
MAX_TEXT = 8000


@dataclass(frozen=True)
class Alert:
    kind: str
    subject: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown alert kind {self.kind!r}; one of {', '.join(KINDS)}")

    def payload(self) -> dict[str, Any]:
        body = asdict(self)
        body["text"] = self.text[:MAX_TEXT]
        body["sent_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        return body


def send(settings: Settings, alert: Alert) -> dict[str, str]:
    """Send `alert` on every configured channel; per channel "sent" or why it failed (also logged). A repeat
    of an alert already sent this period (`alerts.repeat_period_s`: the same kind and subject) is counted
    and not sent: {"repeat": "..."} says which of the period it was."""
    policy = settings.alerts
    outcome: dict[str, str] = {}
    log.warning("alert %s: %s", alert.kind, alert.subject)
    payload = alert.payload()
    if policy.repeat_period_s and (policy.webhook_url or policy.email_to):
        from core.alert_log import claim

        try:
            number, before = claim(
                settings.promotion_ledger_url, alert.kind, alert.subject, policy.repeat_period_s
            )
        except Exception as exc:  # never hold an alert back for want of its count
            log.error("alert %s: its repeats cannot be counted (%s); sent anyway", alert.kind, exc)
            number, before = 1, 0
        if number > 1:
            period = policy.repeat_period_s
            return {"repeat": f"repeat {number} of this period ({period} s): counted, not sent"}
        if before > 1:
            payload["details"] = {**payload["details"], "repeats_held_back_last_period": before - 1}
    if policy.webhook_url:
        credential = policy.webhook_authorization.get_secret_value() if policy.webhook_authorization else None
        outcome["webhook"] = _post(policy.webhook_url, payload, policy.timeout_s, credential)
    if policy.email_to:
        outcome["email"] = _mail(settings, payload)
    for channel, result in outcome.items():
        if result != "sent":
            log.error("alert %s not delivered by %s: %s", alert.kind, channel, result)
    return outcome


def _post(url: str, payload: dict[str, Any], timeout_s: float, authorization: str | None = None) -> str:
    headers = {"Content-Type": "application/json"}
    if authorization:
        headers["Authorization"] = authorization  # never logged: a failure names the status, not the header
    request = urllib.request.Request(
        url, data=json.dumps(payload, default=str).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        return f"the webhook answered {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        return f"the webhook could not be reached: {exc}"
    return "sent" if 200 <= status < 300 else f"the webhook answered {status}"


def _mail(settings: Settings, payload: dict[str, Any]) -> str:
    policy = settings.alerts
    message = EmailMessage()
    message["Subject"] = f"[mlops {payload['kind']}] {payload['subject']}"[:250]
    message["From"] = policy.email_from
    message["To"] = ", ".join(policy.email_to)
    details = json.dumps(payload["details"], indent=2, sort_keys=True, default=str)
    message.set_content(f"{payload['text']}\n\n{details}\n")
    try:
        with smtplib.SMTP(policy.smtp_host or "", policy.smtp_port, timeout=policy.timeout_s) as smtp:
            if policy.smtp_starttls:
                context = ssl.create_default_context(
                    cafile=str(policy.smtp_ca_file) if policy.smtp_ca_file else None
                )
                smtp.starttls(context=context)  # the server's certificate is checked against its name
            if policy.smtp_username and policy.smtp_password:
                smtp.login(policy.smtp_username, policy.smtp_password.get_secret_value())
            smtp.send_message(message)
    except smtplib.SMTPAuthenticationError as exc:
        return (
            f"the mail server {policy.smtp_host}:{policy.smtp_port} refused the login of "
            f"{policy.smtp_username} ({exc.smtp_code}): check MLOPS_ALERTS__SMTP_USERNAME and its password"
        )
    except (smtplib.SMTPException, OSError, ssl.SSLError) as exc:
        return f"the mail server {policy.smtp_host}:{policy.smtp_port} refused or was unreachable: {exc}"
    return "sent"
