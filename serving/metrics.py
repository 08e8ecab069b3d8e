"""The scoring service's Prometheus metrics, at `GET /metrics` (the `read` role, like /status).

Per service, a registry of its own (prometheus_client's CollectorRegistry, not the process-wide default, so
that two services in one process never mix): a latency histogram and response counts per route and status
(counted by the outermost middleware, so refusals by the guard are in), decisions by kind (approve, decline,
review) and the champion's version, and, read from the service itself at each scrape, what /status shows:
transactions, batches, the micro-batcher's queue depth and its refusals, non-finite scores, the shadow's
failures and skipped batches, the online-store writes and scoring-log rows dropped or pending, the live
state's daily fold (count, last and longest pause), reloads, the models in use with their thresholds, and
an alias moved outside the promotion history. Every label is bounded: routes are the service's own (anything
else is `other`), statuses are HTTP codes, decisions three words, versions those the registry holds.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from serving.outcomes import route_of

if TYPE_CHECKING:
    from serving.app import Service

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Request latency in seconds: sub-millisecond scoring to a slow second.
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServiceMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.latency = Histogram(
            "mlops_scoring_request_duration_seconds",
            "Time from a request's arrival to its response's start, by route",
            ["route"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.responses = Counter(
            "mlops_scoring_responses",
            "Responses by route and HTTP status",
            ["route", "status"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "mlops_scoring_decisions",
            "Scored transactions by decision and the champion's version",
            ["decision", "version"],
            registry=self.registry,
        )
        self._service: Service | None = None
        self.registry.register(_ServiceCollector(self))

    def attach(self, service: Service) -> None:
        self._service = service

    def responded(self, path: str, status: int, seconds: float) -> None:
        route = route_of(path)
        self.latency.labels(route).observe(seconds)
        self.responses.labels(route, str(status)).inc()

    def decided(self, results: list[dict[str, Any]]) -> None:
        for result in results:
            self.decisions.labels(result["decision"], result["model"]["version"]).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ServiceCollector(Collector):
    """What the service holds, read at scrape time (no copy to keep in step)."""

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Any]:
        service = self.metrics._service
        if service is None:
            return
        counters = service.scorer.counters
        for name, value, text in (
            ("transactions", counters.transactions, "Transactions scored"),
            ("batches", counters.batches, "Model calls (micro-batches)"),
            ("non_finite_scores", counters.non_finite_scores, "Scores that were not a number (declined)"),
            ("shadow_failures", counters.shadow_failures, "Batches the shadow failed to score"),
            ("shadow_skipped", counters.shadow_skipped, "Batches left unshadowed: the shadow was behind"),
            ("overloaded", service.batcher.refused, "Scoring requests refused with 503: the queue was full"),
            ("folds", counters.folds, "Daily folds of the live state"),
            ("model_reloads", service.models.reloads, "Times the champion or shadow in use changed"),
        ):
            yield CounterMetricFamily(f"mlops_scoring_{name}", text, value=value)
        queue = service.batcher.queued
        yield GaugeMetricFamily("mlops_scoring_queue_depth", "Scoring requests waiting for the scorer", queue)
        yield GaugeMetricFamily(
            "mlops_scoring_fold_last_seconds", "The last daily fold's pause of scoring", counters.fold_last_s
        )
        yield GaugeMetricFamily(
            "mlops_scoring_fold_max_seconds", "The longest daily fold's pause of scoring", counters.fold_max_s
        )
        dropped = getattr(service.state, "store_writes_dropped", None)
        if dropped is not None:
            yield CounterMetricFamily(
                "mlops_scoring_store_writes_dropped",
                "Online-store writes dropped (queue full)",
                value=dropped,
            )
        log = service.scoring_log
        if log is not None:
            yield GaugeMetricFamily(
                "mlops_scoring_log_pending_rows", "Scoring-log rows not yet written", log.pending
            )
            yield CounterMetricFamily(
                "mlops_scoring_log_dropped_rows",
                "Scoring-log rows dropped (over the bound)",
                value=log.dropped,
            )
            yield CounterMetricFamily(
                "mlops_scoring_log_written_rows", "Scoring-log rows written", value=log.written
            )
        loaded = service.models.current
        models = GaugeMetricFamily(
            "mlops_scoring_model_threshold",
            "The models in use (role: champion, shadow) and the threshold each decides at",
            labels=["role", "version"],
        )
        for role, model in (("champion", loaded.champion), ("shadow", loaded.shadow)):
            if model is not None:
                models.add_metric([role, model.version], model.threshold)
        yield models
        yield GaugeMetricFamily(
            "mlops_scoring_ready", "1 while a champion is loaded, else 0", int(loaded.champion is not None)
        )
        yield GaugeMetricFamily(
            "mlops_scoring_alias_out_of_band",
            "1 while MLflow's champion alias points where the promotion history does not (not served)",
            int(service.models.alias_problem is not None),
        )
        yield GaugeMetricFamily(
            "mlops_scoring_uptime_seconds", "Seconds since start", time.time() - service.started
        )


class TimeResponses:
    """ASGI middleware: each HTTP response's route, status and time to its start, into ServiceMetrics (the
    outermost layer, so a refusal by the guard is measured too)."""

    def __init__(self, app: Any, metrics_of) -> None:
        self.app = app
        self.metrics_of = metrics_of

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        metrics = self.metrics_of(scope) if scope["type"] == "http" else None
        if metrics is None:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        path = scope["path"]
        answered = False

        async def timed(message: Any) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
                metrics.responded(path, int(message["status"]), time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, timed)
        except Exception:
            if not answered:
                metrics.responded(path, 500, time.perf_counter() - started)
            raise
