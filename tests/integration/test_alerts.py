"""Alerts (core/alerts.py, orchestration/alerts.py) against a webhook and a mail server on 127.0.0.1
(tests/receivers.py): a task that fails on its last try in a real Airflow run, and a channel that cannot be
reached, which is reported, not raised. The monitoring check's alerts are in test_monitoring.py."""

from __future__ import annotations

import time

import pytest

from core.settings import get_settings


def test_a_task_that_fails_its_last_try_alerts_the_webhook_and_the_mail(airflow_db, alert_receiver):
    """The monitor DAG run with a malformed date: dates_to_check fails at once (no retry can fix a bad
    parameter) and its failure callback, the DAGs' notifier, sends the alert."""
    from airflow.dag_processing.dagbag import DagBag

    from tests.integration.conftest import dag_run_states

    dag = DagBag(dag_folder="dags").dags["monitor_fraud_model"]
    run = dag.test(run_conf={"date": "2026-02-30"})
    assert dag_run_states(run)["dates_to_check"] == "failed"
    received = alert_receiver.received
    (post,) = received.posts
    assert post["kind"] == "task_failed"
    assert post["subject"].startswith("monitor_fraud_model.dates_to_check failed")
    assert post["details"]["error"] == (
        "RunParameterError: '2026-02-30' is not a date; give YYYY-MM-DD, several comma-separated"
    )
    assert post["details"]["run_id"] == run.run_id and post["details"]["try_number"] == 1
    (mail,) = received.mails
    assert mail["Subject"].startswith("[mlops task_failed] monitor_fraud_model.dates_to_check failed")
    assert received.recipients == [["risk-team@example.com"]]
    assert "'2026-02-30' is not a date" in mail.get_payload()


def test_an_unreachable_channel_is_reported_and_the_caller_goes_on(monkeypatch):
    import socket

    from core.alerts import Alert, send

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("MLOPS_ALERTS__WEBHOOK_URL", f"http://127.0.0.1:{port}/hook")
    monkeypatch.setenv("MLOPS_ALERTS__EMAIL_TO", '["ops@example.com"]')
    monkeypatch.setenv("MLOPS_ALERTS__SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("MLOPS_ALERTS__SMTP_PORT", str(port))
    monkeypatch.setenv("MLOPS_ALERTS__TIMEOUT_S", "2")
    get_settings.cache_clear()
    outcome = send(get_settings(), Alert("drift", "drift in the check of 2026-03-10", "two inputs drifted"))
    assert outcome["webhook"].startswith("the webhook could not be reached")
    assert outcome["email"].startswith(f"the mail server 127.0.0.1:{port} refused or was unreachable")
    with pytest.raises(ValueError, match="unknown alert kind"):
        Alert("whatever", "s", "t")
    monkeypatch.setenv("MLOPS_ALERTS__WEBHOOK_URL", "file:///etc/passwd")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="must be an http:// or https:// URL"):
        get_settings()
    monkeypatch.setenv("MLOPS_ALERTS__WEBHOOK_URL", "https://hooks.example.com/x")
    monkeypatch.delenv("MLOPS_ALERTS__SMTP_HOST")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match=r"email_to is set but alerts\.smtp_host is not"):
        get_settings()


def test_a_mail_server_wanting_tls_and_a_login_and_a_webhook_wanting_a_credential(tmp_path, monkeypatch):
    """STARTTLS (the server's certificate checked against a CA the settings name), then a PLAIN login, then
    the mail; the webhook gets its Authorization header. A wrong password is reported by the login's name,
    never the password; a login without STARTTLS, or half a login, is refused at the settings."""
    import ssl

    from core.alerts import Alert, send
    from tests.receivers import AlertReceiver, self_signed

    cert_file, key_file = self_signed(tmp_path)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert_file, key_file)
    receiver = AlertReceiver(tls=tls, login=("alerts@bank.example", "s3cret-pass"))
    try:
        for name, value in {
            **receiver.environment(),
            "MLOPS_ALERTS__SMTP_STARTTLS": "true",
            "MLOPS_ALERTS__SMTP_USERNAME": "alerts@bank.example",
            "MLOPS_ALERTS__SMTP_PASSWORD": "s3cret-pass",
            "MLOPS_ALERTS__SMTP_CA_FILE": str(cert_file),
            "MLOPS_ALERTS__WEBHOOK_AUTHORIZATION": "Bearer hook-token-123",
        }.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        alert = Alert("rollback", "v3 rolled back to v2", "live AUC-PR fell")
        assert send(get_settings(), alert) == {"webhook": "sent", "email": "sent"}
        received = receiver.received
        assert received.mail_sessions == [{"tls": True, "user": "alerts@bank.example"}]
        assert received.authorizations == ["Bearer hook-token-123"]
        assert "s3cret-pass" not in repr(get_settings().alerts)  # a secret, not printed

        monkeypatch.setenv("MLOPS_ALERTS__SMTP_PASSWORD", "wrong")
        get_settings.cache_clear()
        refused = send(get_settings(), alert)["email"]
        assert "refused the login of alerts@bank.example (535)" in refused and "wrong" not in refused
        assert len(received.mails) == 1

        monkeypatch.delenv("MLOPS_ALERTS__SMTP_CA_FILE")  # the system's CAs do not know this certificate
        monkeypatch.setenv("MLOPS_ALERTS__SMTP_PASSWORD", "s3cret-pass")
        get_settings.cache_clear()
        assert "CERTIFICATE_VERIFY_FAILED" in send(get_settings(), alert)["email"]
    finally:
        receiver.close()
    monkeypatch.setenv("MLOPS_ALERTS__SMTP_STARTTLS", "false")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="password would cross the network in clear"):
        get_settings()
    monkeypatch.setenv("MLOPS_ALERTS__SMTP_STARTTLS", "true")
    monkeypatch.delenv("MLOPS_ALERTS__SMTP_PASSWORD")
    get_settings.cache_clear()
    with pytest.raises(ValueError, match="go together"):
        get_settings()
    get_settings.cache_clear()


def test_an_alert_repeated_within_its_period_reaches_people_once_and_the_next_period_says_how_often(
    alert_receiver, monkeypatch
):
    """Counted in the database every sender reaches (core/alert_log.py): the same kind and subject once a
    period, whichever process sends it; another subject or kind is another alert; the first of the next
    period says how many were held back."""
    from core.alert_log import claim
    from core.alerts import Alert, send

    monkeypatch.setenv("MLOPS_ALERTS__REPEAT_PERIOD_S", "3600")
    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    lag = Alert("label_lag", "the check of 2026-03-10 waits for chargebacks", "12% of the expected reports")
    outcomes = [send(settings, lag) for _ in range(3)]
    assert outcomes[0] == {"webhook": "sent", "email": "sent"}
    assert [o.get("repeat", "")[:8] for o in outcomes[1:]] == ["repeat 2", "repeat 3"]
    assert send(settings, Alert("drift", lag.subject, "drifted"))["webhook"] == "sent"  # another kind
    other = Alert("label_lag", "the check of 2026-03-11 waits for chargebacks", "9%")
    assert send(settings, other)["webhook"] == "sent"  # another subject
    assert alert_receiver.received.kinds() == ["label_lag", "drift", "label_lag"]
    # the next period: its first is sent, with the count held back in the one before
    url = settings.promotion_ledger_url
    hour = 3600
    now = time.time()
    assert claim(url, "label_lag", lag.subject, hour, now=now + hour) == (1, 3)
    assert claim(url, "label_lag", lag.subject, hour, now=now + hour) == (2, 3)


def test_a_repeat_count_that_cannot_be_kept_holds_no_alert_back(alert_receiver, monkeypatch):
    from core.alerts import Alert, send

    get_settings.cache_clear()
    blocked = get_settings().mlflow_dir  # where the local profile's database would be: a file, not a folder
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("not a folder")
    alert = Alert("drift", "drift in the check of 2026-03-10", "two inputs drifted")
    assert send(get_settings(), alert)["webhook"] == "sent"  # the count could not be kept: sent anyway
    assert send(get_settings(), alert)["webhook"] == "sent"
    assert alert_receiver.received.kinds() == ["drift", "drift"]
