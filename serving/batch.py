"""Batch scoring: a day's transactions scored with a registered version (the champion unless named), each
with the features the scoring service would have given it that day, decisions written to the lake.

The definition is the parity replay's (serving/replay.py): the live state is loaded from the lake as of the
day's start, and the day's silver transactions and fraud chargebacks are fed to it in event-time order (a
chargeback at the same millisecond first). Here they go straight to the service's own scorer, in process,
not over HTTP: the same contract parsing, the same state, the same feature assembly and the same ONNX
session, so a backtest, a back-fill or a challenger's "what would it have decided" is what serving would have
answered. Silver holds pseudonyms, which is what the service's state holds once it has replaced a caller's
raw ids, so no landing file and no pseudonym key are needed: a day can be scored as long as silver keeps it.

Output: `lake/decisions/date=<day>/v<version>.parquet`, the scoring log's columns (serving/scoring_log.py)
with `caller` = "batch" and `scored_at` the event time, written whole and renamed into place (a rerun of the
same day and version replaces it; another version's file stays beside it). A transaction the state refuses
(older than its entities' kept history, as the service would refuse it with 422) is not scored: it is
counted and named in the summary, never silently left out.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.settings import Settings
    from serving.scorer import Scorer
    from serving.scoring_log import Columns

log = logging.getLogger(__name__)

CALLER = "batch"
CHUNK = 256  # consecutive transactions scored together (the state takes them in order within a chunk)
NAMED_REFUSALS = 100  # refused transactions named in the summary; all are counted


def decisions_dir(settings: Settings, day: date) -> Path:
    return settings.lake / "decisions" / f"date={day.isoformat()}"


class EventClock:
    """The scorer's clock in a batch: the time of the latest event fed (a day's events come in order), so the
    state moves on the day's own time and a rerun is the same run."""

    def __init__(self, start: datetime) -> None:
        self.current = start

    def now(self) -> datetime:
        return self.current

    def reach(self, when: datetime) -> None:
        self.current = max(self.current, when)


@dataclass
class BatchReport:
    day: str
    model_version: str
    transactions: int = 0
    scored: int = 0
    declined: int = 0
    chargebacks: int = 0
    chargebacks_attributed: int = 0
    refused: int = 0
    refused_transactions: list[dict[str, str]] = field(default_factory=list)  # the first NAMED_REFUSALS
    path: str = ""
    seconds: float = 0.0


class _Rows:
    """The scorer's scoring log, in memory: its scored batches as it hands them over (columns), in order."""

    def __init__(self) -> None:
        self.batches: list[Columns] = []

    def append_columns(self, batch: Columns) -> None:
        self.batches.append(batch)


def _scorer(settings: Settings, day: date, version: str | None) -> tuple[Scorer, _Rows, EventClock]:
    from features.live import LiveState
    from serving.features import LiveFeatures
    from serving.models import Loaded, Models, ModelSource, ModelUnavailableError
    from serving.replay import day_start
    from serving.scorer import Scorer

    source = ModelSource(
        settings.mlflow_tracking_uri,
        ledger_url=settings.serving_ledger_url,
        default_threshold=settings.serving.threshold,
    )
    if version is None:
        champion = source.champion()
        if champion is None or champion.version is None:
            raise ModelUnavailableError(
                f"the promotion history records no champion of {source.name}; name a version with --version, "
                "or promote one first"
            )
        version = champion.version
    models = Models(source, shadow=False)
    models.current = Loaded(source.load(version), None)
    models.problem = None
    start = day_start(day)
    clock = EventClock(start)
    # No online-store writes: a batch must not move what the service reads.
    live = LiveState.from_lake(settings, start, max_bytes=settings.serving.max_state_bytes)
    state = LiveFeatures(live, None)
    sink = _Rows()  # the scorer's scoring log: it only appends
    scorer = Scorer(
        models,
        state,
        sink,  # type: ignore[arg-type]
        clock=clock,
        reasons=settings.serving.reasons,
        reason_count=settings.serving.reason_count,
    )
    return scorer, sink, clock


def score_day(settings: Settings, day: date, version: str | None = None) -> BatchReport:
    """Score `day` (see the module docstring) and write its decisions; returns what was done."""
    import pyarrow.parquet as pq

    from core.errors import PipelineError
    from pipelines.contracts import TRANSACTIONS_CONTRACT
    from pipelines.lake import Tables
    from serving.contract import validate_request
    from serving.replay import day_events
    from serving.scorer import DECLINE, TransactionRefusedError
    from serving.scoring_log import columns_table, schema

    started = time.perf_counter()
    events = day_events(settings, day, raw_ids=False)
    if not any(kind == "transaction" for kind, _ in events):
        raise PipelineError(
            f"no silver transaction has an event time on {day} (in {Tables(settings.lake).silver}): "
            "nothing to score. Ingest the arrivals that hold the day first (`mlops ingest --date ...`), or "
            "pick a day that silver holds"
        )
    scorer, sink, clock = _scorer(settings, day, version)
    champion = scorer.models.current.champion
    assert champion is not None
    report = BatchReport(day.isoformat(), champion.version)
    pending: list[dict[str, Any]] = []

    def flush() -> None:
        if not pending:
            return
        items, _ = validate_request(TRANSACTIONS_CONTRACT, list(pending), stored=True)
        pending.clear()
        clock.reach(items[-1]["event_timestamp"])
        now = time.perf_counter()
        (outcome,) = scorer.score([items], [now], [CALLER], inline=True)
        if not isinstance(outcome, TransactionRefusedError):
            if isinstance(outcome, Exception):
                raise outcome
            return
        # One of the chunk is refused, so none of it was kept: one at a time, to refuse that one alone.
        for item in items:
            (alone,) = scorer.score([[item]], [now], [CALLER], inline=True)
            if isinstance(alone, TransactionRefusedError):
                report.refused += 1
                if len(report.refused_transactions) < NAMED_REFUSALS:
                    report.refused_transactions.append(
                        {"transaction_id": item["transaction_id"], "why": alone.rule}
                    )
            elif isinstance(alone, Exception):
                raise alone

    try:
        for kind, item in events:
            if kind == "transaction":
                report.transactions += 1
                pending.append(item)
                if len(pending) >= CHUNK:
                    flush()
                continue
            flush()  # a chargeback moves merchant state from its time on: the transactions before it first
            when = datetime.fromisoformat(item["label_timestamp"].replace("Z", "+00:00"))
            clock.reach(when)
            report.chargebacks += 1
            with scorer._lock:
                scorer.state.advance(when)
                report.chargebacks_attributed += scorer.state.observe_chargeback(item["transaction_id"], when)
        flush()
    finally:
        scorer.close()
        scorer.state.close()
    for batch in sink.batches:
        batch.data["scored_at"] = batch.data["event_timestamp"]  # when it would have been scored, not now
        batch.data["latency_ms"] = [0.0] * batch.rows
    decided = columns_table(sink.batches) if sink.batches else schema().empty_table()
    report.scored = decided.num_rows
    report.declined = decided["decision"].to_pylist().count(DECLINE)
    folder = decisions_dir(settings, day)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"v{champion.version}.parquet"
    partial = folder / f".{target.name}.{os.getpid()}.tmp"
    pq.write_table(decided, partial)
    os.replace(partial, target)
    report.path = str(target)
    report.seconds = round(time.perf_counter() - started, 3)
    (folder / f"v{champion.version}.summary.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    log.info(
        "batch scoring of %s with v%s: %d scored, %d refused, %d chargebacks",
        day,
        champion.version,
        report.scored,
        report.refused,
        report.chargebacks,
    )
    return report


def main(argv: list[str] | None = None) -> int:
    """`python -m serving.batch --date D [--version V]`: the batch DAG's pod (the training image) runs it.
    Like the other pod commands it prints its result as one JSON line last and, in a pod, records it for the
    launching task (core/pod_results.py). An empty `--version` is the champion (a DAG param left empty)."""
    import argparse

    from core.pod_results import emit
    from core.settings import get_settings

    parser = argparse.ArgumentParser(prog="python -m serving.batch", description=__doc__.splitlines()[0])
    parser.add_argument("--date", required=True, type=date.fromisoformat, help="YYYY-MM-DD")
    parser.add_argument("--version", default="", help="a registered version (default: the champion)")
    args = parser.parse_args(argv)
    report = score_day(get_settings(), args.date, args.version.strip() or None)
    emit(asdict(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
