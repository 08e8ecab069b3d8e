"""What the service answered, per minute: every response counted by route and status code, kept as Parquet
beside the scoring log (`<scoring log>/_requests/date=YYYY-MM-DD/`, by the service's clock, like the scoring
log), so the monitor can check the service's error and refusal rates per day (monitoring/service.py). The
scoring log has the per-transaction latency; this has what it cannot: the requests that scored nothing.

Bounded: counts, not requests. A key is (minute, route, status); routes are the service's own, anything
else counts as `other` (a caller cannot grow the table with paths of its choosing); at most the open
minutes are held, and a background thread writes each minute once it has closed (every FLUSH_S) and
everything at close. A write that fails is logged and its counts kept for the next one. Partitions older
than the scoring log's retention are deleted.
"""

from __future__ import annotations

import logging
import shutil
import threading
import uuid
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    from serving.clock import ServiceClock

log = logging.getLogger(__name__)

FOLDER = "_requests"
FLUSH_S = 30.0
ROUTES = (
    "/score",
    "/chargebacks",
    "/v2/models/{name}/infer",
    "/v2/health/live",
    "/v2/health/ready",
    "/status",
)


def outcomes_dir(scoring_log_root: Path) -> Path:
    return scoring_log_root / FOLDER


def route_of(path: str) -> str:
    """The route a path belongs to, or `other`."""
    if path in ROUTES:
        return path
    if path.startswith("/v2/models/") and path.endswith("/infer"):
        return "/v2/models/{name}/infer"
    return "other"


class RequestOutcomes:
    def __init__(self, root: Path, clock: ServiceClock, retention_days: int | None = None) -> None:
        self.root = root
        self.clock = clock
        self.retention_days = retention_days
        self._counts: Counter[tuple[str, str, int]] = Counter()  # (minute ISO, route, status) -> responses
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.errors = 0
        self._thread = threading.Thread(target=self._run, name="request-outcomes", daemon=True)
        self._thread.start()

    def record(self, path: str, status: int) -> None:
        minute = self.clock.now().replace(second=0, microsecond=0).isoformat()
        with self._lock:
            self._counts[(minute, route_of(path), status)] += 1

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush(closed_only=True)

    def flush(self, closed_only: bool = False) -> None:
        """Write the counts of closed minutes (or of all, at close), one file per date."""
        current = self.clock.now().replace(second=0, microsecond=0).isoformat()
        with self._lock:
            taken = {k: v for k, v in self._counts.items() if not closed_only or k[0] < current}
            for key in taken:
                del self._counts[key]
        if not taken:
            return
        try:
            self._write(taken)
        except OSError:
            self.errors += 1
            log.exception(
                "request outcomes could not be written under %s; kept for the next write", self.root
            )
            with self._lock:
                self._counts.update(taken)
            return
        self._expire()

    def _write(self, counts: dict[tuple[str, str, int], int]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        by_date: dict[str, list[tuple[str, str, int, int]]] = {}
        for (minute, route, status), n in counts.items():
            by_date.setdefault(minute[:10], []).append((minute, route, status, n))
        for day, rows in by_date.items():
            folder = outcomes_dir(self.root) / f"date={day}"
            folder.mkdir(parents=True, exist_ok=True)
            table = pa.table(
                {
                    "minute": pa.array(
                        [datetime.fromisoformat(r[0]) for r in rows], pa.timestamp("us", tz="UTC")
                    ),
                    "route": pa.array([r[1] for r in rows], pa.string()),
                    "status": pa.array([r[2] for r in rows], pa.int16()),
                    "responses": pa.array([r[3] for r in rows], pa.int64()),
                }
            )
            name = f"part-{min(r[0] for r in rows).replace(':', '')}-{uuid.uuid4().hex[:8]}.parquet"
            temporary = folder / f".{name}.tmp"
            pq.write_table(table, temporary)
            temporary.rename(folder / name)

    def _expire(self) -> None:
        if self.retention_days is None:
            return
        oldest = (self.clock.now() - timedelta(days=self.retention_days)).date().isoformat()
        for folder in outcomes_dir(self.root).glob("date=*"):
            if folder.name.removeprefix("date=") < oldest:
                shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.flush()


def read_outcomes(root: Path, day: Any) -> list[dict[str, Any]]:
    """The counts of scoring date `day` (route, status, responses), summed over its minutes."""
    import pyarrow.parquet as pq

    folder = outcomes_dir(root) / f"date={day.isoformat()}"
    totals: Counter[tuple[str, int]] = Counter()
    for path in sorted(folder.glob("part-*.parquet")):
        table = pq.read_table(path).to_pydict()
        for route, status, n in zip(table["route"], table["status"], table["responses"], strict=True):
            totals[(route, int(status))] += int(n)
    return [{"route": r, "status": s, "responses": n} for (r, s), n in sorted(totals.items())]


class CountOutcomes:
    """ASGI middleware: each HTTP response's status, counted (RequestOutcomes) once it starts."""

    def __init__(self, app: ASGIApp, outcomes_of) -> None:
        self.app = app
        self.outcomes_of = outcomes_of  # the app's RequestOutcomes (None until the service has started)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        outcomes = self.outcomes_of(scope)
        started = False

        async def counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and outcomes is not None:
                started = True
                outcomes.record(path, int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, counted)
        except Exception:
            if outcomes is not None and not started:  # the server's error handler answers 500 outside
                outcomes.record(path, 500)
            raise
