"""The scoring service's HTTP interface (FastAPI): `POST /score`, the Open Inference Protocol (v2) for tools
that speak it, the chargeback feed that keeps merchant state current, health and status.

Errors say what to change: 400 for a body that is not JSON, 413 for more transactions than
`serving.max_request_items` (or a body too large to hold them), 422 naming each field and the contract
rule it breaks (an event or label time outside the window around the service's clock included:
serving/clock.py), 503 with the reason while no champion is loaded (never a score from nothing). One
request's failure is its own: the requests scored in the same batch are answered. Anything unexpected is a
500 with a JSON body that names an incident id the log has the details under, never the internals.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from core import pseudonym
from model_contract.onnx import MODEL_NAME
from pipelines.contracts import LABELS_CONTRACT, TRANSACTIONS_CONTRACT, FieldContract
from serving import oip_binary
from serving.auth import Guard, OipErrors, open_callers
from serving.clock import ServiceClock
from serving.contract import ContractError, Violation, validate_request
from serving.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from serving.metrics import ServiceMetrics, TimeResponses
from serving.models import Models, ModelUnavailableError
from serving.outcomes import CountOutcomes, RequestOutcomes
from serving.replication import ReplicationUnavailableError
from serving.scorer import MicroBatcher, OverloadedError, Scorer, TransactionRefusedError

if TYPE_CHECKING:
    from core.settings import Settings
    from serving.features import EntityState

log = logging.getLogger(__name__)
# State-changing calls other than scoring (whose rows, caller included, are the scoring log): one JSON line
# each on this logger, with the caller, the counts and the first AUDITED_IDS transaction ids.
audit = logging.getLogger("serving.audit")
AUDITED_IDS = 100

RETRY_AFTER = {"retry-after": "1"}
MAX_ERASED = 100  # customers one POST /erasures names
# Generous per transaction (a full one is ~300 bytes of JSON): what lets a body be refused before parsing.
BYTES_PER_ITEM = 4096
SERVER_NAME = "mlops-fraud-scoring"
OUTPUTS = (
    {"name": "score", "datatype": "FP64", "shape": [-1]},
    {"name": "decision", "datatype": "BYTES", "shape": [-1]},
)
OUTPUT_TYPES: dict[str, str] = {str(o["name"]): str(o["datatype"]) for o in OUTPUTS}


def _json_type(spec: FieldContract) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number"} if spec.kind == "decimal" else {"type": "string"}
    if spec.kind == "integer":
        schema = {"type": "integer"}
    if spec.allowed:
        schema["enum"] = list(spec.allowed)
    if spec.pattern:
        schema["pattern"] = spec.pattern.replace(r"\z", "$")
    if spec.kind == "timestamp":
        schema["format"] = "date-time"
    if spec.minimum is not None:
        schema["exclusiveMinimum" if spec.min_exclusive else "minimum"] = spec.minimum
    if spec.maximum is not None:
        schema["maximum"] = spec.maximum
    return schema if spec.required else {"anyOf": [schema, {"type": "null"}]}


def _contract_schema(contract) -> dict[str, Any]:
    item = {
        "type": "object",
        "additionalProperties": False,
        "required": list(contract.required),
        "properties": {f.name: _json_type(f) for f in contract.fields},
    }
    return {"oneOf": [item, {"type": "array", "items": item}]}


def _body_doc(contract, example: Any) -> dict[str, Any]:
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _contract_schema(contract), "example": example}},
        }
    }


EXAMPLE = {
    "transaction_id": "tx00000000000000a1",
    "customer_id": "c0000001",
    "merchant_id": "m000001",
    "amount": 42.5,
    "currency": "EUR",
    "country": "DE",
    "channel": "contactless",
    "merchant_category": "grocery",
    "event_timestamp": "2026-01-10T12:30:00Z",
}


class ORJSONResponse(Response):
    """JSON by orjson (FastAPI's own ORJSONResponse is deprecated in favour of response models, which would
    validate every result through Pydantic on the hot path)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


class Service:
    """What the endpoints share. The live state loads on a thread of its own after start
    (`start_loading`): the process answers /v2/health/live at once, and /v2/health/ready and the scoring
    routes answer 503 with the reason until it is loaded."""

    def __init__(self, settings: Settings, live_from: datetime | None) -> None:
        from serving.features import PendingState
        from serving.scoring_log import DayLineage, ScoringLog

        self.settings = settings
        self.started = time.time()
        self.models = Models.from_settings(settings)
        # Raw ids are replaced on arrival (core/pseudonym.py): the live state, the online store and the
        # scoring log only ever see pseudonyms. No key, no service: it fails here, at start.
        self.pseudonyms = pseudonym.for_settings(settings)
        self.replay_from = live_from or settings.serving.live_from
        self.clock = ServiceClock(
            settings.serving.max_lateness_s, settings.serving.max_future_skew_s, self.replay_from
        )
        reach = settings.ingest.late_event_days * 86_400
        if settings.serving.max_lateness_s + settings.serving.max_future_skew_s > reach:
            log.warning(
                "serving.max_lateness_s + serving.max_future_skew_s (%.0f s) exceed ingest.late_event_days "
                "(%d s): a late transaction inside the window may be refused for its entity's kept history",
                settings.serving.max_lateness_s + settings.serving.max_future_skew_s,
                reach,
            )
        self.loading: str | None = "the live state is loading from the lake"
        self.restored: dict[str, int] = {}
        self.scoring_log = (
            ScoringLog(
                settings.scoring_log_dir,
                settings.serving.log_flush_rows,
                settings.serving.log_flush_interval_s,
                settings.serving.log_max_pending_rows,
                settings.serving.log_retention_days,
                on_written=DayLineage(settings),
            )
            if settings.serving.scoring_log
            else None
        )
        # Prometheus metrics (GET /metrics): a registry of this service's own (serving/metrics.py).
        self.metrics = ServiceMetrics()
        self.scorer = Scorer(
            self.models,
            PendingState(),
            self.scoring_log,
            clock=self.clock,
            metrics=self.metrics,
            reasons=settings.serving.reasons,
            reason_count=settings.serving.reason_count,
        )
        self.metrics.attach(self)
        if settings.serving.replicated:
            from serving.replication import Replication, wait_for_redis

            wait_for_redis(settings.cluster.redis_url)
            self.scorer.replication = Replication.connect(
                settings.cluster.redis_url,
                settings.serving.replication_key,
                settings.serving.replication_max_entries,
            )
        # Every response counted per minute, beside the scoring log (serving/outcomes.py).
        self.outcomes = (
            RequestOutcomes(settings.scoring_log_dir, self.clock, settings.serving.log_retention_days)
            if settings.serving.scoring_log
            else None
        )
        self.batcher = MicroBatcher(
            self.scorer,
            settings.serving.max_batch_size,
            settings.serving.max_wait_ms,
            settings.serving.max_queued_requests,
        )
        self._loader = threading.Thread(target=self._load, name="live-state-load", daemon=True)
        # Replicated: what the others append reaches this replica while it scores nothing too (an erasure
        # above all), and it says how far it has applied (serving/replication.py).
        self._stopping = threading.Event()
        self.replica_name = f"{socket.gethostname()}:{os.getpid()}"
        self._ticker = threading.Thread(target=self._tick, name="replication-tick", daemon=True)

    @property
    def state(self) -> EntityState:
        """The entity state in use: the scorer's (a placeholder until it has loaded)."""
        return self.scorer.state

    def without_champion(self, problem: str | None) -> str:
        """Why nothing can be scored while no champion is loaded: that problem first (loading ends by
        itself, this does not), then the state's loading if it is still going on."""
        return "; ".join(reason for reason in (problem, self.loading) if reason)

    def start_loading(self) -> None:
        self._loader.start()
        if self.scorer.replication is not None:
            self._ticker.start()

    def erase(self, pseudonyms: list[str]) -> dict[str, Any]:
        """Forget these customers (POST /erasures; on the scorer's thread). Replicated, the erasure is an
        entry of the log, applied here at once (and by every replica at the same point of the order) or,
        while the state loads, after the log's earlier entries; alone, it is applied under the scorer's lock,
        or kept for the state that is loading. Then what the person's scoring already handed to the scoring
        log and the online store is written (`settle`), so the caller's rewrite of those finds all of it."""
        from serving.features import NOTHING_FORGOTTEN, PendingState
        from serving.replication import encode_erasure

        replication = self.scorer.replication
        answer: dict[str, Any] = {"customers": len(pseudonyms), "forgotten": dict(NOTHING_FORGOTTEN)}
        with self.scorer._lock:
            if replication is not None:
                answer["sequence"], _ = replication.append(encode_erasure(pseudonyms, self.clock.now()))
                if not isinstance(self.state, PendingState):
                    replication.catch_up(self.state, getattr(self.state, "live", None))
                    answer["forgotten"] = replication.forgotten.get(answer["sequence"])
            else:
                answer["forgotten"] = self.state.forget(pseudonyms)
            answer["state"] = "loading: applied once loaded" if self.loading else "forgotten"
        answer["settled"] = self.settle()
        return answer

    def _load(self) -> None:
        from serving.features import open_state

        try:
            # Serving live, the transactions scored since the last landing come back from the scoring log
            # (a restart loses none); a replay starts from the lake at its day, as it always did.
            state, self.restored = open_state(
                self.settings, self.replay_from or self.clock.now(), restore=self.replay_from is None
            )
        except Exception as exc:
            log.exception("the live state could not be loaded")
            self.loading = f"the live state could not be loaded ({exc}); see the service's log"
            return
        # What loading built (the state's columns, the models, the imports) lives as long as the process:
        # frozen out of the cyclic collector, whose full passes would otherwise walk all of it and stall
        # requests for as long (docs/benchmarks.md, "Scoring service").
        replication = self.scorer.replication
        if replication is not None:
            # the whole log since what the lake holds: what the other replicas observed (a transaction this
            # state already has is a resend to it and changes nothing)
            try:
                caught_up = replication.catch_up(state, getattr(state, "live", None))
            except Exception as exc:
                log.exception("the replication log could not be applied")
                self.loading = f"the replication log could not be applied ({exc}); see the service's log"
                return
            log.info("replication: %d entries of the log applied at start", caught_up)
        gc.collect()
        gc.freeze()
        with self.scorer._lock:
            pending = getattr(self.scorer.state, "forgotten", None)
            if pending:  # erased while the state loaded (alone: replicated, the log brought them)
                forgotten = state.forget(sorted(pending))
                log.info("live state: %d erased while it loaded, forgotten: %s", len(pending), forgotten)
            self.scorer.state = state
        self.loading = None

    def settle(self, timeout_s: float = 30.0) -> bool:
        """Write what scoring handed to the scoring log and the online store's writer so far; False when
        either did not finish within `timeout_s` (logged)."""
        done = True
        if self.scoring_log is not None:
            try:
                self.scoring_log.flush(timeout_s)
            except TimeoutError as exc:
                log.error("%s", exc)
                done = False
        settle = getattr(self.state, "settle", None)
        if settle is not None and not settle(timeout_s):
            log.error("the online store's writer did not finish its backlog in %.0f s", timeout_s)
            done = False
        return done

    def _tick(self) -> None:
        """Replicated: every `serving.replication_poll_s`, apply what the others appended (under the scorer's
        lock, as a batch would), write what an erasure among it left on its way to disk, and report how far
        this replica has applied the log."""
        replication = self.scorer.replication
        assert replication is not None
        settled = 0  # erasures applied (here or by a batch's sync) whose rows in flight were written
        while not self._stopping.wait(self.settings.serving.replication_poll_s):
            try:
                if self.loading is not None:
                    # alive, and how far its catch-up got: an erasure waits for it and trims nothing it
                    # has yet to read. A load that failed reports nothing: an erasure does not wait on a
                    # replica that will never serve (it is not ready, and says why).
                    if self._loader.is_alive():
                        replication.report(self.replica_name)
                    continue
                with self.scorer._lock:
                    replication.catch_up(self.state, getattr(self.state, "live", None))
                    erasures = replication.erasures
                if erasures != settled and self.settle():
                    settled = erasures
                if erasures == settled:  # never past an erasure whose rows are not all on disk yet
                    replication.report(self.replica_name)
            except Exception:
                # broken (readiness says so) or Redis away for now: the next batch or tick tries again
                log.exception("replication: the log could not be applied or reported")

    def close(self) -> None:
        self._stopping.set()
        self.models.stop()
        self.scorer.close()  # the shadow's backlog reaches the scoring log first
        if self.scoring_log is not None:
            self.scoring_log.close()
        if self.outcomes is not None:
            self.outcomes.close()
        if self._loader.is_alive():
            self._loader.join(timeout=60)
        self.state.close()


def _error(status: int, detail: Any) -> ORJSONResponse:
    return ORJSONResponse({"detail": detail}, status_code=status)


def _too_large(size: int, limit: int) -> ORJSONResponse:
    return _error(
        413,
        f"the body ({size} bytes or more) is larger than {limit} transactions can be; send at most {limit} "
        "per request (serving.max_request_items)",
    )


async def _read_raw(request: Request, limit: int) -> tuple[bytes, ORJSONResponse | None]:
    most = limit * BYTES_PER_ITEM
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > most:
        return b"", _too_large(int(length), limit)
    # Read as it comes, and stop at the limit: a chunked body (no length) is never held whole first.
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > most:
            return b"", _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks), None


async def _read_items(request: Request, limit: int) -> tuple[Any, ORJSONResponse | None]:
    raw, refused = await _read_raw(request, limit)
    if refused:
        return None, refused
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return None, _error(400, f"the body is not JSON: {exc}")
    if isinstance(body, list) and len(body) > limit:
        return None, _error(
            413, f"{len(body)} transactions in one request; at most {limit} (serving.max_request_items)"
        )
    return body, None


def create_app(settings: Settings | None = None, live_from: datetime | None = None) -> FastAPI:
    from core.settings import get_settings

    settings = settings or get_settings()
    limit = settings.serving.max_request_items
    callers = open_callers(settings)  # before serving: a missing or broken tokens file stops the start
    if not audit.handlers:  # the audit lines go to the service's output whatever else is configured
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s audit %(message)s"))
        audit.addHandler(handler)
        audit.setLevel(logging.INFO)
        audit.propagate = False

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        service = Service(settings, live_from)
        service.models.start()
        service.batcher.start()
        service.start_loading()
        app.state.service = service
        try:
            yield
        finally:
            await service.batcher.stop()
            service.close()

    app = FastAPI(
        title="Fraud scoring",
        summary="Scores card transactions with the champion model and features kept current.",
        default_response_class=ORJSONResponse,
        lifespan=lifespan,
    )

    def service_of(request: Request) -> Service:
        return request.app.state.service

    def caller_of(request: Request) -> str | None:
        return request.scope.get("state", {}).get("caller")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> ORJSONResponse:
        incident = uuid.uuid4().hex[:12]
        log.error("incident %s: %s %s failed", incident, request.method, request.url.path, exc_info=exc)
        return _error(500, f"the service failed on this request (incident {incident} in its log); try again")

    async def score_items(request: Request, items: list[dict[str, Any]], received: float, many: bool):
        service = service_of(request)
        if service.models.current.champion is None:
            return None, _error(
                503, service.without_champion(f"no model to score with: {service.models.problem}")
            )
        if service.loading:
            return None, ORJSONResponse({"detail": service.loading}, status_code=503, headers=RETRY_AFTER)
        service.pseudonyms.replace_in(items)  # before anything looks the ids up or records them
        try:
            return await service.batcher.submit(items, received, caller_of(request)), None
        except ModelUnavailableError as exc:
            return None, _error(503, f"no model to score with: {exc}")
        except (OverloadedError, ReplicationUnavailableError) as exc:
            return None, ORJSONResponse({"detail": str(exc)}, status_code=503, headers=RETRY_AFTER)
        except TransactionRefusedError as exc:
            violation = Violation(exc.index if many else None, exc.field, exc.rule)
            return None, _error(422, [violation.as_dict()])

    def outside_window(service: Service, items: list[dict[str, Any]], field: str, many: bool):
        """422 naming each item whose `field` lies outside the service clock's window, or None."""
        violations = service.clock.outside(items, field, many)
        return _error(422, [v.as_dict() for v in violations]) if violations else None

    @app.post(
        "/score",
        summary="Score one transaction or a list",
        description="Each transaction must follow the transactions data contract (the ingestion rules). "
        "Returns, per transaction, the score, the decision at the champion's own threshold (its operating "
        "point, chosen at training; `serving.threshold` for a version without one), the champion's "
        "version, the feature values used and which entities had no state.",
        openapi_extra=_body_doc(TRANSACTIONS_CONTRACT, EXAMPLE),
    )
    async def score(request: Request):
        received = time.perf_counter()
        body, refused = await _read_items(request, limit)
        if refused:
            return refused
        try:
            items, many = validate_request(TRANSACTIONS_CONTRACT, body)
        except ContractError as exc:
            return _error(422, [v.as_dict() for v in exc.violations])
        refused = outside_window(service_of(request), items, "event_timestamp", many)
        if refused:
            return refused
        results, failed = await score_items(request, items, received, many)
        if failed:
            return failed
        # A response, not the dict: FastAPI would first walk the answer with its jsonable_encoder, a sixth of
        # a request's time on the event loop (docs/benchmarks.md, "Scoring service").
        return ORJSONResponse(results if many else results[0])

    @app.post(
        "/chargebacks",
        summary="The chargeback feed: fraud reports that move merchant state",
        description="Label events (the labels data contract). A fraud report counts towards its merchant's "
        "chargebacks from its label time on, as in the gold features.",
        openapi_extra=_body_doc(
            LABELS_CONTRACT,
            {
                "transaction_id": "tx00000000000000a1",
                "is_fraud": 1,
                "label_timestamp": "2026-01-12T08:00:00Z",
            },
        ),
    )
    async def chargebacks(request: Request):
        body, refused = await _read_items(request, limit)
        if refused:
            return refused
        try:
            items, many = validate_request(LABELS_CONTRACT, body)
        except ContractError as exc:
            return _error(422, [v.as_dict() for v in exc.violations])
        service = service_of(request)
        if service.loading:
            return ORJSONResponse({"detail": service.loading}, status_code=503, headers=RETRY_AFTER)
        refused = outside_window(service, items, "label_timestamp", many)
        if refused:
            return refused
        reported = [i for i in items if i["is_fraud"] == 1]
        try:
            loop_result = await _in_scorer(service, reported)
        except ReplicationUnavailableError as exc:
            return ORJSONResponse({"detail": str(exc)}, status_code=503, headers=RETRY_AFTER)
        answer = {
            "received": len(items),
            "fraud_reports": len(reported),
            "attributed": loop_result.count(True),
            "unknown_transactions": [
                i["transaction_id"] for i, ok in zip(reported, loop_result, strict=True) if not ok
            ],
        }
        record = {
            "call": "chargebacks",
            "caller": caller_of(request),
            **{k: v for k, v in answer.items() if k != "unknown_transactions"},
            "transaction_ids": [i["transaction_id"] for i in reported][:AUDITED_IDS],
            "ids_left_out": max(0, len(reported) - AUDITED_IDS),
        }
        audit.info("%s", orjson.dumps(record).decode())
        return answer

    @app.post(
        "/erasures",
        summary="Forget people: their state leaves the service (`mlops erase` calls it)",
        description="`customer_ids`: the raw ids (1 to 100) of the people erased; `request`: the erasure "
        "request's reference, for the audit record. Their transactions leave their merchants' running "
        "totals and their chargebacks the merchants' counts, and they have no history from here on; then "
        "what their scoring already handed to the scoring log and the online store is written, so the "
        "erasure's rewrite of those finds it. Replicated, every replica forgets them at the same point of "
        "the log. Needs the `erase` role.",
    )
    async def erasures(request: Request):
        import asyncio

        from core.pseudonym import customer_id

        body, refused = await _read_items(request, limit)
        if refused:
            return refused
        ids = body.get("customer_ids") if isinstance(body, dict) else None
        reference = body.get("request", "") if isinstance(body, dict) else ""
        if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_ERASED or not isinstance(reference, str):
            return _error(
                422,
                f'the body is {{"customer_ids": [1 to {MAX_ERASED} customer ids], "request": "<reference>"}}',
            )
        try:
            customers = sorted({customer_id(c) if isinstance(c, str) else customer_id(repr(c)) for c in ids})
        except ValueError as exc:
            return _error(422, f"customer_ids: {exc}")
        service = service_of(request)
        pseudonyms = [service.pseudonyms.customer(c) for c in customers]
        try:
            answer = await asyncio.get_running_loop().run_in_executor(
                service.batcher.executor, service.erase, pseudonyms
            )
        except ReplicationUnavailableError as exc:
            return ORJSONResponse({"detail": str(exc)}, status_code=503, headers=RETRY_AFTER)
        # the audit record names the request and the counts, never the people
        record = {"call": "erasures", "caller": caller_of(request), "request": reference[:200], **answer}
        audit.info("%s", orjson.dumps(record).decode())
        return answer

    @app.get("/v2/health/live", summary="The process is up")
    async def live():
        return {"live": True}

    @app.get("/v2/health/ready", summary="A champion is loaded (503 with the reason otherwise)")
    async def ready(request: Request):
        service = service_of(request)
        champion = service.models.current.champion
        if champion is None:
            return ORJSONResponse(
                {"ready": False, "reason": service.without_champion(service.models.problem)}, status_code=503
            )
        if service.loading:
            return ORJSONResponse({"ready": False, "reason": service.loading}, status_code=503)
        broken = service.scorer.replication.problem if service.scorer.replication is not None else None
        if broken:  # its state can no longer be exact: no traffic until it is restarted
            return ORJSONResponse({"ready": False, "reason": broken}, status_code=503)
        behind = service.scoring_log.problem if service.scoring_log is not None else None
        if behind:  # decisions would go unrecorded: take no traffic until the log catches up
            return ORJSONResponse({"ready": False, "reason": behind}, status_code=503)
        return {"ready": True, "model": champion.name, "version": champion.version}

    @app.get("/v2", summary="Open Inference Protocol: server metadata")
    async def server_metadata():
        return {"name": SERVER_NAME, "version": "2", "extensions": [oip_binary.EXTENSION]}

    def _model_or_404(request: Request, name: str):
        service = service_of(request)
        if name != MODEL_NAME:
            return None, _error(404, f"no model {name!r} here; this service serves {MODEL_NAME!r}")
        return service, None

    @app.get("/v2/models/{name}", summary="Open Inference Protocol: model metadata")
    async def model_metadata(request: Request, name: str):
        service, missing = _model_or_404(request, name)
        if missing:
            return missing
        champion = service.models.current.champion
        return {
            "name": MODEL_NAME,
            "versions": [champion.version] if champion else [],
            "platform": "onnxruntime_onnx",
            "inputs": [
                {"name": f.name, "datatype": "FP64" if f.kind == "decimal" else "BYTES", "shape": [-1]}
                for f in TRANSACTIONS_CONTRACT.fields
            ],
            "outputs": list(OUTPUTS),
        }

    @app.get("/v2/models/{name}/ready", summary="Open Inference Protocol: model readiness")
    async def model_ready(request: Request, name: str):
        service, missing = _model_or_404(request, name)
        if missing:
            return missing
        champion = service.models.current.champion
        if champion is None:
            return ORJSONResponse(
                {"name": name, "ready": False, "reason": service.models.problem}, status_code=503
            )
        return {"name": name, "ready": True}

    @app.post(
        "/v2/models/{name}/infer",
        summary="Open Inference Protocol: score transactions given as columns",
        description="`inputs`: one tensor per contract field (BYTES for text and times, FP64 for amount), "
        "all of the same length; `outputs`: `score` (FP64) and `decision` (BYTES).",
    )
    async def infer(request: Request, name: str):
        received = time.perf_counter()
        _, missing = _model_or_404(request, name)
        if missing:
            return missing
        raw, refused = await _read_raw(request, limit)
        if refused:
            return refused
        answered: list[str] = list(OUTPUT_TYPES)
        try:  # the JSON header, and the binary tensor data after it (serving/oip_binary.py)
            body, binary = oip_binary.split(raw, request.headers.get(oip_binary.HEADER))
            if isinstance(body, dict):
                oip_binary.fill_binary_inputs(body, binary)
                answered = oip_binary.asked_outputs(body, tuple(OUTPUT_TYPES))
        except oip_binary.ProtocolError as exc:
            return ORJSONResponse({"error": str(exc)}, status_code=400)
        columns, problem = _oip_columns(body, limit)
        if problem:
            return ORJSONResponse({"error": problem[1]}, status_code=problem[0])
        length = len(next(iter(columns.values()))) if columns else 0
        items = [{name: values[i] for name, values in columns.items()} for i in range(length)]
        try:
            parsed, _ = validate_request(TRANSACTIONS_CONTRACT, items)
        except ContractError as exc:
            return ORJSONResponse(
                {"error": str(exc), "detail": [v.as_dict() for v in exc.violations]}, status_code=422
            )
        violations = service_of(request).clock.outside(parsed, "event_timestamp", True)
        if violations:
            return ORJSONResponse(
                {"error": str(ContractError(violations)), "detail": [v.as_dict() for v in violations]},
                status_code=422,
            )
        results, failed = await score_items(request, parsed, received, True)
        if failed:
            return ORJSONResponse({"error": failed.body.decode()}, status_code=failed.status_code)
        champion_version = results[0]["model"]["version"] if results else None
        values = {"score": [r["score"] for r in results], "decision": [r["decision"] for r in results]}
        outputs = [
            {"name": name, "datatype": OUTPUT_TYPES[name], "shape": [len(results)], "data": values[name]}
            for name in answered
        ]
        head = {"model_name": MODEL_NAME, "model_version": champion_version, "id": body.get("id")}
        content, header_length = oip_binary.answer(head, outputs, oip_binary.wants_binary(body, answered))
        if header_length is None:
            return Response(content, media_type="application/json")
        return Response(
            content,
            media_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(header_length)},
        )

    @app.get(
        "/metrics",
        summary="Prometheus metrics: latency per route, responses, decisions, queue, fold, models",
        response_class=Response,
    )
    async def metrics(request: Request):
        return Response(service_of(request).metrics.render(), media_type=METRICS_CONTENT_TYPE)

    @app.get("/status", summary="Models in use, counters of this process")
    async def status(request: Request):
        service = service_of(request)
        loaded = service.models.current
        counters = service.scorer.counters
        window = service.clock.window()
        return {
            "champion": loaded.champion.version if loaded.champion else None,
            "champion_file": loaded.champion.file if loaded.champion else None,
            "champion_threshold": _decides(loaded.champion),
            "shadow": loaded.shadow.version if loaded.shadow else None,
            "shadow_threshold": _decides(loaded.shadow),
            "problem": service.models.problem,
            "alias_out_of_band": service.models.alias_problem,
            # the tokens file, read again when it changes (serving/auth.py RotatingCallers)
            "tokens": None
            if callers is None
            else {"callers": len(callers), "reloads": callers.reloads, "problem": callers.problem},
            "model_reloads": service.models.reloads,
            "transactions": counters.transactions,
            "batches": counters.batches,
            "largest_batch": counters.largest_batch,
            "shadow_failures": counters.shadow_failures,
            "shadow_skipped": counters.shadow_skipped,
            "overloaded": service.batcher.refused,
            "store_writes_dropped": getattr(service.state, "store_writes_dropped", None),
            "non_finite_scores": counters.non_finite_scores,
            "scoring_log_rows_written": service.scoring_log.written if service.scoring_log else None,
            "scoring_log_write_errors": service.scoring_log.errors if service.scoring_log else None,
            "scoring_log_pending_rows": service.scoring_log.pending if service.scoring_log else None,
            "scoring_log_dropped_rows": service.scoring_log.dropped if service.scoring_log else None,
            "live_state": service.settings.serving.live_state,
            # Which key the ids are pseudonymised with (its id, never the key): ingestion's must be the same.
            "pseudonym_key_id": service.pseudonyms.key_id,
            "live_state_loading": service.loading,
            "restored_from_scoring_log": service.restored,
            # several replicas, one ordered log (serving/replication.py); None: a single process
            "replication": None
            if service.scorer.replication is None
            else service.scorer.replication.status(),
            # Objects the cyclic collector no longer walks: what loading built (Service._load).
            "gc_frozen_objects": gc.get_freeze_count(),
            "clock": {
                "mode": service.clock.mode,
                "now": service.clock.now().isoformat(),
                "window": [window.earliest.isoformat(), window.latest.isoformat()],
            },
            "uptime_s": time.time() - service.started,
        }

    # Middleware added last runs first: Guard (auth, Host, content type, admission), then the direct path.
    app.add_middleware(Direct, routes={("POST", "/score"): score})
    app.add_middleware(
        Guard,
        callers=callers,
        public_read=settings.serving.public_read,
        allowed_hosts=settings.serving.allowed_hosts,
        max_in_flight=settings.serving.max_in_flight,
    )
    # The Open Inference Protocol's error object on every /v2 error, the guard's included.
    app.add_middleware(OipErrors)
    # Outermost: a response Guard refuses is counted, and timed, too.
    app.add_middleware(CountOutcomes, outcomes_of=_outcomes_of)
    app.add_middleware(TimeResponses, metrics_of=_metrics_of)
    return app


def _metrics_of(scope: Scope) -> ServiceMetrics | None:
    service = getattr(scope["app"].state, "service", None)
    return None if service is None else service.metrics


def _outcomes_of(scope: Scope) -> RequestOutcomes | None:
    service = getattr(scope["app"].state, "service", None)
    return None if service is None else service.outcomes


class Direct:
    """The hot routes straight to their handlers, past Starlette's exception middleware and router and
    FastAPI's dependency solving: that machinery cost about a third of a request's time on the event loop
    (docs/benchmarks.md, "Scoring service"). They stay inside Guard and inside Starlette's server-error
    middleware, whose handler is the JSON 500 with an incident id, like every route; and they stay declared
    on the app, so the OpenAPI document and /docs describe them."""

    def __init__(self, app: ASGIApp, routes: dict[tuple[str, str], Callable[[Request], Awaitable[Any]]]):
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if handler is None:
            await self.app(scope, receive, send)
            return
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)


async def _in_scorer(service: Service, reports: list[dict[str, Any]]) -> list[bool]:
    """Chargebacks go through the scorer's thread, in order with the transactions around them."""
    import asyncio

    def apply() -> list[bool]:
        from serving.scoring_log import journal_chargebacks

        now = service.clock.now()
        if reports and service.scoring_log is not None:
            try:  # kept before it counts, so a restart before the next landing loses none
                journal_chargebacks(service.scoring_log.root, reports, now)
            except OSError:
                log.exception("the chargeback journal under %s cannot be written", service.scoring_log.root)
        # The journal's write and sync are done outside the lock: small batches are scored on the event
        # loop under the same lock (serving/scorer.py), which must not wait on a disk.
        with service.scorer._lock:
            if service.scorer.replication is not None:
                from serving.replication import encode_chargebacks

                pairs = [(r["transaction_id"], r["label_timestamp"]) for r in reports]
                service.scorer.replication.sync(
                    service.state, service.scorer.live, encode_chargebacks(pairs, now)
                )
            service.state.advance(now)
            if service.state.maintenance_due(now):
                service.scorer.fold()  # on the executor's thread, as the scorer does
            return [
                service.state.observe_chargeback(r["transaction_id"], r["label_timestamp"]) for r in reports
            ]

    return await asyncio.get_running_loop().run_in_executor(service.batcher.executor, apply)


def _decides(model) -> dict | None:
    """Where a loaded version decides: its threshold, its review band's, and where they come from."""
    if model is None:
        return None
    return {
        "threshold": model.threshold,
        "review_threshold": model.review_threshold,
        "source": model.threshold_source,
    }


def _oip_columns(body: Any, limit: int) -> tuple[dict[str, list], tuple[int, str] | None]:
    """An OIP request's `inputs` as columns by name, or (status, problem)."""
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list) or not body["inputs"]:
        return {}, (
            400,
            "an inference request needs an `inputs` list of tensors (name, shape, datatype, data)",
        )
    columns: dict[str, list] = {}
    for tensor in body["inputs"]:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            return {}, (400, "each input tensor needs a `name`")
        data = tensor.get("data")
        if not isinstance(data, list):
            return {}, (400, f"input {tensor['name']!r}: `data` must be a flat list")
        columns[tensor["name"]] = data
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) != 1:
        return {}, (400, f"input tensors differ in length: {lengths}")
    if next(iter(lengths.values())) > limit:
        return {}, (413, f"{next(iter(lengths.values()))} transactions in one request; at most {limit}")
    return columns, None
