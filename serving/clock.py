"""The scoring service's own time, and the window of event and label times it takes from callers.

A request's times are the caller's clock: a transaction dated 2099 or a chargeback dated ahead must not move
what the service keeps for everyone else. So the live state's clock (what it forgets, and when) follows this
clock, never a request, and a time outside the window around it is refused with 422 before anything is
scored or kept:

- serving live (no `serving.live_from`): the window is [now - max_lateness_s, now + max_future_skew_s] around
  the machine's clock (UTC). With the defaults (lateness + skew = one `ingest.late_event_days`), every
  transaction inside it is within the reach of the history the live state keeps for its entities, so it is
  scored (docs/serving.md, "Event time").
- replaying a past day (`serving.live_from` set, `mlops serve --live-from`: the demo, the parity test, the
  benchmarks): the clock starts at `live_from` and runs at the machine's pace, and the window spans the day
  being replayed: [live_from - max_lateness_s, max(now, live_from + 1 day) + max_future_skew_s]. A replay
  service serves one day; start another for the next.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from serving.contract import Violation

REPLAY_SPAN = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    earliest: datetime
    latest: datetime

    def rule(self, what: str) -> str:
        return (
            f"window: {what} must lie in [{_iso(self.earliest)}, {_iso(self.latest)}], around the service's "
            "clock (serving.max_lateness_s before it, serving.max_future_skew_s after it); a time outside it "
            "is the caller's clock, not the service's"
        )


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class ServiceClock:
    """See the module docstring. `wall` gives the machine's time in seconds (a test's own clock)."""

    def __init__(
        self,
        max_lateness_s: float,
        max_future_skew_s: float,
        replay_from: datetime | None = None,
        wall=time.time,
        monotonic=time.monotonic,
    ) -> None:
        if replay_from is not None and replay_from.utcoffset() is None:
            raise ValueError(f"replay_from must be timezone-aware, got {replay_from!r}")
        self.lateness = timedelta(seconds=max_lateness_s)
        self.skew = timedelta(seconds=max_future_skew_s)
        self.replay_from = replay_from
        self._wall = wall
        self._monotonic = monotonic
        self._started = monotonic()

    @property
    def mode(self) -> str:
        return "wall" if self.replay_from is None else "replay"

    def now(self) -> datetime:
        if self.replay_from is None:
            return _EPOCH + timedelta(seconds=self._wall())
        return self.replay_from + timedelta(seconds=self._monotonic() - self._started)

    def window(self) -> Window:
        now = self.now()
        if self.replay_from is None:
            return Window(now - self.lateness, now + self.skew)
        return Window(self.replay_from - self.lateness, max(now, self.replay_from + REPLAY_SPAN) + self.skew)

    def outside(self, items: list[dict[str, Any]], field: str, many: bool) -> list[Violation]:
        """A violation for each item whose `field` (a parsed, tz-aware datetime) lies outside the window."""
        window = self.window()
        return [
            Violation(index if many else None, field, window.rule(field), _iso(item[field]))
            for index, item in enumerate(items)
            if not window.earliest <= item[field] <= window.latest
        ]
