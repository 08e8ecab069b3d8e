"""`serving.scorer.MicroBatcher`: where a batch is scored and what goes in it. A small batch is scored on the
event loop itself (two thread hand-offs cost more than scoring one transaction: docs/benchmarks.md,
"Scoring service"), a large one on the scorer's thread; requests that queued while the scorer was busy go
in one batch, in order, each request's transactions together. The scorer here records what it was given
and where; the real one is exercised through the service in tests/integration/test_scoring_service.py."""

from __future__ import annotations

import asyncio
import threading

from serving.scorer import INLINE_TRANSACTIONS, MicroBatcher


class RecordingScorer:
    def __init__(self) -> None:
        self.calls: list[tuple[list[list[dict]], str]] = []
        self.inline: list[bool] = []
        self.due = False  # what maintenance_due answers: the live state's daily fold waits
        self.replication = None  # one process: no replication log (serving/replication.py)

    def maintenance_due(self) -> bool:
        return self.due

    def score(self, units, received, callers, inline=False):
        self.calls.append(([list(u) for u in units], threading.current_thread().name))
        self.inline.append(inline)
        return [
            [{"transaction_id": t["transaction_id"], "caller": c} for t in u]
            for u, c in zip(units, callers, strict=True)
        ]


def _txns(first: int, count: int) -> list[dict]:
    return [{"transaction_id": f"tx{n:04d}"} for n in range(first, first + count)]


async def _with_batcher(scorer, action, max_batch_size: int = 64):
    batcher = MicroBatcher(scorer, max_batch_size, max_wait_ms=0)
    batcher.start()
    try:
        return await action(batcher)
    finally:
        await batcher.stop()


def test_a_small_batch_is_scored_on_the_event_loop_and_a_large_one_on_the_scorers_thread():
    scorer = RecordingScorer()

    async def action(batcher):
        loop_thread = threading.current_thread().name
        small = await batcher.submit(_txns(0, 1), 0.0, "a")
        large = await batcher.submit(_txns(100, INLINE_TRANSACTIONS + 1), 0.0, "b")
        return loop_thread, small, large

    loop_thread, small, large = asyncio.run(_with_batcher(scorer, action))
    assert small == [{"transaction_id": "tx0000", "caller": "a"}]
    assert [r["transaction_id"] for r in large] == [
        t["transaction_id"] for t in _txns(100, INLINE_TRANSACTIONS + 1)
    ]
    (_, small_thread), (_, large_thread) = scorer.calls
    assert small_thread == loop_thread
    assert large_thread != loop_thread and large_thread.startswith("scorer")
    assert scorer.inline == [True, False]  # told, so that the inline call leaves any fold to the thread


def test_a_small_batch_goes_to_the_scorers_thread_when_the_states_daily_fold_is_due():
    """The fold of a day into the live state's columns takes seconds at a million transactions a day
    (docs/benchmarks.md): the batch that brings it must not hold the event loop."""
    scorer = RecordingScorer()
    scorer.due = True

    async def action(batcher):
        loop_thread = threading.current_thread().name
        await batcher.submit(_txns(0, 1), 0.0, "a")
        return loop_thread

    loop_thread = asyncio.run(_with_batcher(scorer, action))
    ((_, thread),) = scorer.calls
    assert thread != loop_thread and thread.startswith("scorer")
    assert scorer.inline == [False]


def test_requests_that_queued_together_are_one_batch_in_order_each_answered_with_its_own():
    scorer = RecordingScorer()

    async def action(batcher):
        return await asyncio.gather(*(batcher.submit(_txns(10 * k, k + 1), 0.0, f"c{k}") for k in range(3)))

    answers = asyncio.run(_with_batcher(scorer, action))
    assert len(scorer.calls) == 1
    units, _ = scorer.calls[0]
    assert units == [_txns(0, 1), _txns(10, 2), _txns(20, 3)]
    for k, answer in enumerate(answers):
        assert [r["transaction_id"] for r in answer] == [t["transaction_id"] for t in _txns(10 * k, k + 1)]
        assert {r["caller"] for r in answer} == {f"c{k}"}
