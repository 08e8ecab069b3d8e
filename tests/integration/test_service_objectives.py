"""The scoring service's objectives of a day (monitoring/service.py): the real app counts every response
per route and status (serving/outcomes.py, written when the service stops), the scoring log holds each
scored transaction's latency, and the monitoring check judges the day against the settings and alerts
(a webhook and a mail server on 127.0.0.1) when it misses."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from core.settings import get_settings


def _scored(now: datetime, latencies: list[float]) -> list[dict]:
    return [
        {
            "transaction_id": f"tx{n:016x}",
            "customer_id": "c1",
            "merchant_id": "m1",
            "event_timestamp": now - timedelta(seconds=5),
            "scored_at": now,
            "model_name": "fraud-detector",
            "model_version": "1",
            "score": 0.1,
            "decision": "approve",
            "threshold": 0.5,
            "latency_ms": latency,
        }
        for n, latency in enumerate(latencies)
    ]


def test_a_day_of_refusals_and_slow_scores_misses_the_objectives_and_alerts(alert_receiver, monkeypatch):
    from fastapi.testclient import TestClient

    from monitoring.check import run_check
    from monitoring.store import read_results
    from serving.app import create_app
    from serving.outcomes import read_outcomes
    from serving.scoring_log import ScoringLog

    monkeypatch.setenv("MLOPS_SERVING__AUTH", "false")
    monkeypatch.setenv("MLOPS_SERVING__ALLOWED_HOSTS", '["testserver"]')
    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    with TestClient(create_app(settings)) as client:  # the lifespan runs: a service with no champion
        answers = [client.post("/score", json={"transaction_id": "x"}).status_code for _ in range(120)]  # 422
        answers += [
            client.post("/score", content=b"a=1", headers={"content-type": "text/plain"}).status_code
            for _ in range(30)
        ]
        answers += [client.get("/v2/health/live").status_code for _ in range(10)]  # not a scoring route
        answers += [client.post(f"/made-up/{n}", json={}).status_code for n in range(5)]
        day = datetime.now(UTC).date()
    assert answers.count(422) == 120 and answers.count(415) == 30, sorted(set(answers))
    counted = {
        (c["route"], c["status"]): c["responses"] for c in read_outcomes(settings.scoring_log_dir, day)
    }
    assert counted[("/score", 422)] == 120 and counted[("/score", 415)] == 30
    assert (
        counted[("/v2/health/live", 200)] == 10
        and sum(n for (r, _), n in counted.items() if r == "other") == 5
    )

    log = ScoringLog(settings.scoring_log_dir, flush_rows=10_000, flush_interval_s=60)
    log.append(_scored(datetime.now(UTC), [2.0] * 980 + [80.0] * 20))
    log.close()
    result = run_check(settings, day)

    service = result.service
    assert (service.requests, service.refusals, service.errors, service.transactions) == (150, 150, 0, 1000)
    assert service.latency_p50_ms == 2.0 and service.latency_p99_ms == 80.0
    assert service.verdict == "missed"
    assert "latency p99 80.00 ms above 25.0 ms" in service.reason
    assert "refusal rate 1.0000 above 0.02 (120 x 422, 30 x 415)" in service.reason
    row = read_results(settings, day, day, kinds=["service"]).iloc[0]
    assert (row["verdict"], row["rows"], row["note"]) == ("missed", 150, service.reason)
    (alert,) = [p for p in alert_receiver.received.posts if p["kind"] == "service"]
    assert alert["subject"] == f"scoring service missed its objectives on {day}"
    assert alert["details"]["refusal_rate"] == 1.0 and alert["details"]["latency_p99_ms"] == 80.0


def test_a_quiet_day_gives_no_verdict(monkeypatch):
    from monitoring.service import service_day

    settings = get_settings()
    quiet = service_day(settings, datetime.now(UTC).date())
    assert (quiet.verdict, quiet.requests, quiet.latency_p99_ms) == ("insufficient", 0, None)
    assert "fewer than 100 requests, no verdict" in quiet.reason
