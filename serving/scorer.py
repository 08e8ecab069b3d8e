"""Scoring a batch of validated transactions, and the dynamic micro-batcher that forms the batches.

`Scorer.score` is synchronous and scores one batch at a time: the entity state advances transaction by
transaction, so it must see them in one order. `MicroBatcher` gathers concurrent requests on the event loop
(up to `max_batch_size` transactions, waiting at most `max_wait_ms` after the first) and scores each batch,
a small one on the loop itself and a large one on a worker thread (INLINE_TRANSACTIONS): one model call and
one state pass for many requests. A request's transactions stay together and in their order. The batch that
brings the live state's daily fold into columns (seconds at a million transactions a day) is always scored
on the worker thread: the loop keeps taking requests meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from model_contract.inputs import NUMERIC_FEATURES
from serving.features import Assembled, EntityState, Rows, assemble
from serving.models import Loaded, LoadedModel, Models, ModelUnavailableError
from serving.reasons import as_text, explain
from serving.scoring_log import ID_COLUMNS, RAW_COLUMNS, Columns, ScoringLog

if TYPE_CHECKING:  # prometheus_client is the scoring image's alone; the monitor pod imports this module
    from serving.metrics import ServiceMetrics
    from serving.replication import Replication

log = logging.getLogger(__name__)

APPROVE, DECLINE = "approve", "decline"
REVIEW = "review"  # only with a review band (training.review_rate): neither approved nor declined yet


def decide(score: float, model: LoadedModel) -> str:
    """The decision at `model`'s own operating point. A score that is not a number is declined: NaN compares
    false with everything, so `score >= threshold` alone would approve it."""
    if not math.isfinite(score) or score >= model.threshold:
        return DECLINE
    if model.review_threshold is not None and score >= model.review_threshold:
        return REVIEW
    return APPROVE


MAX_SHADOW_BACKLOG = 8  # batches waiting for the shadow model
# A batch of at most this many transactions is scored on the event loop itself (a fraction of a millisecond:
# cheaper than the two hand-offs between threads, which cost a sixth of the service's CPU per request at 500
# requests/s); a larger one on the scorer's thread, so the loop keeps taking requests meanwhile
# (docs/benchmarks.md, "Scoring service"). Either way one batch at a time, in order.
INLINE_TRANSACTIONS = 16


def _missing_note(keys: list[str], txn: dict[str, Any]) -> str:
    who = ", ".join(f"{k.removesuffix('_id')} {txn[k]}" for k in keys)
    return (
        f"no state for {who} (new, or no transaction within the view's TTL): scored with those features "
        "missing, as the model was trained to see them"
    )


class Clock(Protocol):
    def now(self) -> datetime: ...


class OverloadedError(Exception):
    """The scorer's queue is full: the request is refused (503, Retry-After) rather than left to wait."""


class TransactionRefusedError(Exception):
    """One transaction of a request cannot be taken: the request fails alone, with 422 naming it."""

    def __init__(self, index: int, field: str, rule: str) -> None:
        self.index, self.field, self.rule = index, field, rule
        super().__init__(f"item {index}: {field}: {rule}")


@dataclass
class Counters:
    transactions: int = 0
    batches: int = 0
    largest_batch: int = 0
    shadow_failures: int = 0
    shadow_skipped: int = 0  # batches not shadowed: the shadow was still busy with MAX_SHADOW_BACKLOG
    non_finite_scores: int = 0  # declined: a score that is not a number is never an approval
    folds: int = 0  # the live state's daily folds, each a pause of scoring (serving/features.py)
    fold_last_s: float = 0.0  # a fold's pause of scoring (a fold beside the state: its freeze and install)
    fold_max_s: float = 0.0
    fold_build_last_s: float = 0.0  # the last fold's columns built beside the state, without pausing scoring

    def folded(self, seconds: float) -> None:
        self.folds += 1
        self.fold_last_s = seconds
        self.fold_max_s = max(self.fold_max_s, seconds)


@dataclass
class Scorer:
    models: Models
    state: EntityState
    scoring_log: ScoringLog | None
    clock: Clock | None = None  # the service's (serving/clock.py), a batch's event time (serving/batch.py)
    counters: Counters = field(default_factory=Counters)
    metrics: ServiceMetrics | None = None  # decisions counted for /metrics
    reasons: str = "off"  # which decisions carry reasons: not_approved, all, off (serving.reasons)
    reason_count: int = 3
    # Several replicas, one exact state: every batch goes through the replication log first
    # (serving/replication.py); None for a single process.
    replication: Replication | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # The shadow challenger scores on a thread of its own, after the answers are out: its cost is never a
    # request's. At most MAX_SHADOW_BACKLOG batches wait for it; past that a batch goes unshadowed (counted).
    _shadow: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="shadow")
    )
    _shadow_backlog: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(MAX_SHADOW_BACKLOG)
    )

    @property
    def live(self) -> Any:
        """The live state under the entity state (features.live.LiveState), None for another source."""
        return getattr(self.state, "live", None)

    def fold(self) -> None:
        """The live state's daily fold, its pause of scoring timed (/status and /metrics show it). Called
        under the scorer's lock. A live state folds beside itself: here only the freeze, the columns are built
        on a thread of their own without the lock, and installed under it (features/live/state.py
        begin_fold); a pause of a few milliseconds each, not seconds (docs/benchmarks.md)."""
        started = time.perf_counter()
        begin = getattr(self.state, "begin_fold", None)
        if begin is None:
            self.state.maintain()
            self.counters.folded(time.perf_counter() - started)
            return
        job = begin()
        if job is None:
            return
        paused = time.perf_counter() - started
        beside = threading.Thread(target=self._fold_beside, args=(job, paused), name="live-state-fold")
        beside.daemon = True
        beside.start()

    def _fold_beside(self, job: Any, paused: float) -> None:
        state: Any = self.state  # a LiveFeatures: it has begun the fold
        built = time.perf_counter()
        try:
            state.build_fold(job)
        except Exception:  # the state stays as it was; the fold is due again at the next batch
            log.exception("the live state's fold failed; it is put back and tried again")
        self.counters.fold_build_last_s = time.perf_counter() - built
        with self._lock:
            started = time.perf_counter()
            state.finish_fold(job)
            self.counters.folded(paused + time.perf_counter() - started)

    def maintenance_due(self) -> bool:
        """Whether the next batch brings the state's daily fold (read without the lock: a stale answer
        only sends one batch to the scorer's thread, or leaves the fold to the next)."""
        return self.clock is not None and self.state.maintenance_due(self.clock.now())

    def score(
        self,
        units: Sequence[Sequence[dict[str, Any]]],
        received: Sequence[float],
        callers: Sequence[str | None] | None = None,
        inline: bool = False,
    ) -> list[list[dict[str, Any]] | Exception]:
        """Per unit (a request's transactions, received at `received[u]` from `callers[u]`, which the
        scoring log keeps): its results, or the exception
        that failed it alone (TransactionRefusedError for a transaction the state cannot take, anything
        unexpected as raised); the other units are scored. A refused unit leaves nothing in the state.
        Raises ModelUnavailableError when no champion is loaded: nothing is scored and the entity state
        does not move."""
        loaded = self.models.current
        champion = loaded.champion
        if champion is None:
            raise ModelUnavailableError(self.models.problem or "no champion loaded")
        outcomes: list[list[dict[str, Any]] | Exception | None] = []
        txns: list[dict[str, Any]] = []
        arrived: list[float] = []
        sent_by: list[str | None] = []
        state_rows: Rows = []
        with self._lock:
            now = self.clock.now() if self.clock is not None else None
            if self.replication is not None:
                from serving.replication import encode_units

                # every entry before this batch's in the log first, then the batch as every replica applies it
                self.replication.sync(self.state, self.live, encode_units([list(u) for u in units], now))
            if now is not None:
                self.state.advance(now)
                if not inline and self.state.maintenance_due(now):
                    self.fold()  # the daily fold: on the scorer's thread, never the loop's
            for unit, when, caller in zip(units, received, callers or [None] * len(units), strict=True):
                try:
                    refused = self.state.refusal(unit)
                    if refused is not None:
                        raise TransactionRefusedError(refused[0], "event_timestamp", f"late: {refused[1]}")
                    state_rows += self.state.rows(unit)
                except Exception as exc:  # this request's failure is its own
                    if not isinstance(exc, TransactionRefusedError):
                        log.exception("a request of %d transactions failed in the entity state", len(unit))
                    outcomes.append(exc)
                    continue
                outcomes.append(None)
                txns += unit
                arrived += [when] * len(unit)
                sent_by += [caller] * len(unit)
            if txns:
                assembled = assemble(state_rows, txns)
                scores = champion.score(assembled.x)
                self.counters.transactions += len(txns)
                self.counters.batches += 1
                self.counters.largest_batch = max(self.counters.largest_batch, len(txns))
        if not txns:
            return [o for o in outcomes if o is not None]
        results = self._results(loaded, champion, txns, arrived, sent_by, assembled, scores)
        done: list[list[dict[str, Any]] | Exception] = []
        offset = 0
        for unit, outcome in zip(units, outcomes, strict=True):
            if outcome is None:
                done.append(results[offset : offset + len(unit)])
                offset += len(unit)
            else:
                done.append(outcome)
        return done

    def _results(
        self,
        loaded: Loaded,
        champion: LoadedModel,
        txns: list[dict[str, Any]],
        received: list[float],
        callers: list[str | None],
        assembled: Assembled,
        scores: np.ndarray,
    ) -> list[dict[str, Any]]:
        """Each scored transaction's answer; their rows go to the scoring log (through the shadow, which
        adds its scores, when one is loaded)."""
        done = time.perf_counter()
        # The service's clock (a replay's is the replayed day's): what the scoring log is partitioned by.
        scored_at = self.clock.now() if self.clock is not None else datetime.now(UTC)
        results, missing_text, reasons_text = [], [], []
        non_finite_before = self.counters.non_finite_scores
        decisions = [decide(float(score), champion) for score in scores]
        explained = (
            {}
            if self.reasons == "off"
            else explain(
                champion,
                assembled.x,
                scores,
                [i for i, d in enumerate(decisions) if self.reasons == "all" or d != APPROVE],
                self.reason_count,
            )
        )
        for i, txn in enumerate(txns):
            score = float(scores[i])
            finite = math.isfinite(score)
            decision = decisions[i]
            reasons = explained.get(i)
            features = assembled.features[i]
            missing = assembled.missing[i]
            notes = [_missing_note(missing, txn)] if missing else []
            if not finite:
                self.counters.non_finite_scores += 1
                notes.append(
                    f"champion v{champion.version} gave no finite score ({score}): declined, not approved; "
                    "counted in /status non_finite_scores"
                )
            results.append(
                {
                    "transaction_id": txn["transaction_id"],
                    "score": score if finite else None,
                    "decision": decision,
                    "threshold": champion.threshold,
                    "model": {"name": champion.name, "version": champion.version},
                    "features": features,
                    "missing_entities": missing,
                    "reasons": reasons,
                    "notes": notes,
                }
            )
            missing_text.append(",".join(missing) or None)
            reasons_text.append(as_text(reasons))
        if self.counters.non_finite_scores > non_finite_before:  # one line a batch, not one a transaction
            log.error(
                "champion v%s gave %d non-finite scores in a batch of %d: declined",
                champion.version,
                self.counters.non_finite_scores - non_finite_before,
                len(txns),
            )
        batch = None
        if self.scoring_log is not None:
            batch = _log_columns(
                txns, scored_at, champion, scores, decisions, assembled, callers,
                missing_entities=missing_text,
                reasons=reasons_text,
                latency_ms=(done - np.asarray(received)) * 1000.0,
            )  # fmt: skip
        if loaded.shadow is not None and self._shadow_backlog.acquire(blocking=False):
            self._shadow.submit(self._shadowed, loaded.shadow, assembled.x, batch)
        else:
            if loaded.shadow is not None:
                self.counters.shadow_skipped += 1
            if self.scoring_log is not None and batch is not None:
                self.scoring_log.append_columns(batch)
        if self.metrics is not None:
            self.metrics.decided(results)
        return results

    def _shadowed(self, shadow: LoadedModel, x: np.ndarray, batch: Columns | None) -> None:
        """The shadow's scores of a batch, added to its log columns (None: no scoring log), then logged."""
        try:
            scores = np.asarray(shadow.score(x), dtype="float64").reshape(-1)
            if batch is None:
                return
            batch.data.update(
                shadow_version=[shadow.version] * batch.rows,
                shadow_score=scores,
                # what the shadow would have decided, at its own operating point
                shadow_threshold=[shadow.threshold] * batch.rows,
                shadow_decision=[decide(float(score), shadow) for score in scores],
            )
        except Exception:  # a shadow's failure is logged, never the caller's problem
            self.counters.shadow_failures += 1
            log.exception("shadow v%s failed to score", shadow.version)
        finally:
            self._shadow_backlog.release()
            if self.scoring_log is not None and batch is not None:
                self.scoring_log.append_columns(batch)

    def close(self) -> None:
        """Wait for the shadow's backlog (its rows reach the scoring log)."""
        self._shadow.shutdown(wait=True)


def _log_columns(
    txns: list[dict[str, Any]],
    scored_at: datetime,
    champion: LoadedModel,
    scores: np.ndarray,
    decisions: list[str],
    assembled: Assembled,
    callers: list[str | None],
    *,
    missing_entities: list[str | None],
    reasons: list[str | None],
    latency_ms: np.ndarray,
) -> Columns:
    """The batch's scoring-log rows as columns (serving/scoring_log.py schema), from what scoring made: the
    model inputs' float64 table as it is, a list per request field; no dict a row. The shadow's columns are
    null until `Scorer._shadowed` fills them."""
    count = len(txns)
    data: dict[str, Any] = {
        name: [txn[name] for txn in txns] for name in (*ID_COLUMNS, "event_timestamp", *RAW_COLUMNS)
    }
    data.update(zip(NUMERIC_FEATURES, assembled.numeric.T, strict=True))
    data.update(
        scored_at=[scored_at] * count,
        model_name=[champion.name] * count,
        model_version=[champion.version] * count,
        score=np.asarray(scores, dtype="float64").reshape(-1),
        decision=decisions,
        threshold=[champion.threshold] * count,
        shadow_version=[None] * count,
        shadow_score=[None] * count,
        shadow_threshold=[None] * count,
        shadow_decision=[None] * count,
        missing_entities=missing_entities,
        reasons=reasons,
        latency_ms=latency_ms,
        caller=callers,
    )
    return Columns(scored_at.astimezone(UTC).date(), count, data)


@dataclass
class _Unit:
    txns: list[dict[str, Any]]
    received: float
    caller: str | None
    future: asyncio.Future


class MicroBatcher:
    """Dynamic micro-batching on the event loop (see the module docstring). `max_batch_size=1` scores each
    request alone, through the same thread."""

    def __init__(
        self, scorer: Scorer, max_batch_size: int, max_wait_ms: float, max_queued: int = 256
    ) -> None:
        self.scorer = scorer
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queued = max_queued
        self.refused = 0  # requests refused with 503: the queue was full
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scorer")
        self._queue: asyncio.Queue[_Unit] | None = None
        self._task: asyncio.Task | None = None

    @property
    def queued(self) -> int:
        """Scoring requests waiting for the scorer now."""
        return self._queue.qsize() if self._queue is not None else 0

    def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.max_queued)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="micro-batcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.executor.shutdown(wait=True)

    async def submit(
        self, txns: list[dict[str, Any]], received: float, caller: str | None = None
    ) -> list[dict[str, Any]]:
        assert self._queue is not None, "start() the batcher on the serving loop first"
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Unit(txns, received, caller, future))
        except asyncio.QueueFull:
            self.refused += 1
            raise OverloadedError(
                f"the scorer has {self.max_queued} requests waiting (serving.max_queued_requests): try again "
                "shortly"
            ) from None
        return await future

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            units = [await self._queue.get()]
            size = len(units[0].txns)
            deadline = loop.time() + self.max_wait_s
            while size < self.max_batch_size:
                try:
                    unit = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        unit = await asyncio.wait_for(self._queue.get(), remaining)
                    except TimeoutError:
                        break
                units.append(unit)
                size += len(unit.txns)
            try:
                batch = ([u.txns for u in units], [u.received for u in units], [u.caller for u in units])
                if (
                    size <= INLINE_TRANSACTIONS
                    and not self.scorer.maintenance_due()
                    and self.scorer.replication is None  # a round trip to Redis: never on the loop
                ):
                    outcomes = self.scorer.score(*batch, inline=True)
                else:
                    outcomes = await loop.run_in_executor(self.executor, self.scorer.score, *batch)
            except Exception as exc:  # the whole batch: no champion, or the model call itself failed
                for u in units:
                    if not u.future.done():
                        u.future.set_exception(exc)
                continue
            for u, outcome in zip(units, outcomes, strict=True):
                if u.future.done():  # its caller went away
                    continue
                if isinstance(outcome, Exception):
                    u.future.set_exception(outcome)
                else:
                    u.future.set_result(outcome)
