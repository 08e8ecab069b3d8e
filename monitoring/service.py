"""The scoring service's objectives of a day, from what it recorded: the server-side latency of each scored
transaction (the scoring log's `latency_ms`) and every response of the scoring routes per status
(serving/outcomes.py). Checked against `monitoring.max_latency_p99_ms`, `max_error_rate` (5xx but 503) and
`max_refusal_rate` (4xx and 503: bad input, auth, overload, a service still loading); fewer than
`monitoring.min_requests` requests give no verdict. Days are the service's own (its clock), as the logs'.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import date
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.settings import Settings

SCORING_ROUTES = ("/score", "/v2/models/{name}/infer", "/chargebacks")


@dataclass(frozen=True)
class ServiceDay:
    day: date
    verdict: str  # met | missed | insufficient
    reason: str
    requests: int
    errors: int
    refusals: int
    transactions: int  # scored, from the scoring log
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    statuses: dict[str, int]

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def refusal_rate(self) -> float | None:
        return self.refusals / self.requests if self.requests else None

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "day": self.day.isoformat(),
            "error_rate": self.error_rate,
            "refusal_rate": self.refusal_rate,
        }


def is_error(status: int) -> bool:
    return 500 <= status <= 599 and status != 503


def is_refusal(status: int) -> bool:
    return 400 <= status <= 499 or status == 503


def service_day(settings: Settings, day: date) -> ServiceDay:
    """The objectives of scoring date `day` (see the module docstring)."""
    import pyarrow.parquet as pq

    from serving.outcomes import read_outcomes
    from serving.scoring_log import PARTITION

    policy = settings.monitoring
    counts = [c for c in read_outcomes(settings.scoring_log_dir, day) if c["route"] in SCORING_ROUTES]
    statuses: dict[str, int] = {}
    for c in counts:
        statuses[str(c["status"])] = statuses.get(str(c["status"]), 0) + c["responses"]
    requests = sum(statuses.values())
    errors = sum(n for s, n in statuses.items() if is_error(int(s)))
    refusals = sum(n for s, n in statuses.items() if is_refusal(int(s)))
    files = sorted((settings.scoring_log_dir / f"{PARTITION}={day.isoformat()}").glob("*.parquet"))
    latency = (
        np.concatenate([pq.read_table(f, columns=["latency_ms"])["latency_ms"].to_numpy() for f in files])
        if files
        else np.zeros(0)
    )
    p50, p95, p99 = (float(v) for v in np.percentile(latency, [50, 95, 99])) if len(latency) else (None,) * 3
    figures = (
        f"{requests} scoring requests on {day}: {errors} errors, {refusals} refusals; {len(latency)} "
        f"transactions scored"
        + (f", latency p50 {p50:.2f} / p95 {p95:.2f} / p99 {p99:.2f} ms" if p99 else "")
    )
    if requests < policy.min_requests:
        verdict, reason = "insufficient", f"{figures}: fewer than {policy.min_requests} requests, no verdict"
    else:
        missed = []
        if p99 is not None and p99 > policy.max_latency_p99_ms:
            missed.append(f"latency p99 {p99:.2f} ms above {policy.max_latency_p99_ms} ms")
        if errors / requests > policy.max_error_rate:
            missed.append(f"error rate {errors / requests:.4f} above {policy.max_error_rate}")
        if refusals / requests > policy.max_refusal_rate:
            top = sorted(((n, s) for s, n in statuses.items() if is_refusal(int(s))), reverse=True)[:3]
            listed = ", ".join(f"{n} x {s}" for n, s in top)
            missed.append(
                f"refusal rate {refusals / requests:.4f} above {policy.max_refusal_rate} ({listed})"
            )
        verdict = "missed" if missed else "met"
        reason = f"{figures}: " + ("; ".join(missed) if missed else "every objective met")
    return ServiceDay(day, verdict, reason, requests, errors, refusals, len(latency), p50, p95, p99, statuses)
