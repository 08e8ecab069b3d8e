"""Replay a day of the lake through a running scoring service, as the day happened: its silver transactions
and its fraud chargebacks in one event-time order (a chargeback reported at the same millisecond as a
transaction goes first, as the gold features count reports up to and including the transaction's time).

The service must have been started with its live state taking over at the day's start
(`mlops serve --live-from <day>T00:00:00`), so the day's transactions are not in its history twice. Used by
the demo, the parity test and the benchmarks.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as dtime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core import pseudonym
from pipelines.contracts import TRANSACTION_COLUMNS
from pipelines.lake import Tables

if TYPE_CHECKING:
    from core.settings import Settings


@dataclass(frozen=True)
class Running:
    """A scoring service started here: its base URL and a token per role from its tokens file."""

    url: str
    tokens: dict[str, str]

    def headers(self, role: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.tokens[role]}"} if role in self.tokens else {}


def _tokens(env: dict[str, str]) -> dict[str, str]:
    """A plain-text token per role from the service's tokens file (serving/auth.py), {} without auth."""
    from pydantic import TypeAdapter

    from serving.auth import TOKENS_FILE, plain_tokens

    # read as the service's settings read it (pydantic's bool: "off", "0", "false", ...)
    if not TypeAdapter(bool).validate_python(env.get("MLOPS_SERVING__AUTH", "true")):
        return {}
    configured = env.get("MLOPS_SERVING__TOKENS_FILE")
    return plain_tokens(Path(configured) if configured else Path(env["MLOPS_HOME"]) / TOKENS_FILE)


@contextlib.contextmanager
def replay_service(
    env: dict[str, str], day: date, port: int, log_path: Path, ready_timeout_s: float = 180.0
) -> Iterator[Running]:
    """`mlops serve` as a process with its live state taking over at the start of `day`, ready (a champion
    loaded) before this yields its base URL and tokens (the tokens file of its MLOPS_HOME, which the local
    profile generates on first start); stopped with SIGTERM afterwards, which flushes its scoring log.
    `env` is the process's whole environment (the settings as MLOPS_* variables)."""
    import httpx

    args = [
        sys.executable, "-m", "mlops.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--live-from", day_start(day).strftime("%Y-%m-%dT%H:%M:%S"),
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + ready_timeout_s
        reason = "no answer"
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the scoring service exited ({process.returncode}): {log_path.read_text()[-2000:]}"
                )
            try:
                answer = httpx.get(f"{url}/v2/health/ready", timeout=5)
                if answer.status_code == 200:
                    break
                reason = answer.json().get("reason", answer.text)
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scoring service was not ready in {ready_timeout_s:.0f} s: {reason}")
            time.sleep(0.3)
        yield Running(url, _tokens(env))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def day_start(day: date) -> datetime:
    return datetime.combine(day, dtime.min, tzinfo=UTC)


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def day_events(settings: Settings, day: date, raw_ids: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """("chargeback" | "transaction", request item) of `day`, in the order they happened: the silver
    transactions with an event time on `day` (whatever date they arrived), and the fraud reports with a
    label time on `day`.

    Silver holds pseudonyms; a caller of the service sends raw ids, which the service pseudonymises on
    arrival. So each transaction is sent with the raw ids of its landing files (`original_ids`), as its
    producer sent them, and the replay also proves that the service's pseudonyms are ingestion's. With
    `raw_ids` False the items keep silver's pseudonyms (batch scoring, which feeds the state directly)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    tables = Tables(settings.lake)
    start, end = day_start(day), day_start(day + timedelta(days=1))
    events: list[tuple[datetime, int, str, dict[str, Any]]] = []
    if tables.silver.is_dir():
        silver = ds.dataset(tables.silver, format="parquet", partitioning="hive")
        stamp = pc.field("event_timestamp")
        rows = silver.to_table(
            columns=[*TRANSACTION_COLUMNS, "arrival_date"], filter=(stamp >= start) & (stamp < end)
        ).to_pylist()
        raw = (
            original_ids(settings, sorted({_as_date(row["arrival_date"]) for row in rows})) if raw_ids else {}
        )
        for row in rows:
            when = row["event_timestamp"].astimezone(UTC)
            item = {name: row[name] for name in TRANSACTION_COLUMNS}
            for column in pseudonym.COLUMNS if raw_ids else ():
                try:
                    item[column] = raw[item[column]]
                except KeyError:
                    raise RuntimeError(
                        f"transaction {item['transaction_id']} of {day}: no raw {column} in the landing "
                        f"files of its arrival {row['arrival_date']} ({settings.landing}) has the pseudonym "
                        f"{item[column]}. Its landing folder is gone (retention.landing_days) or was "
                        "ingested under another pseudonym key; a day can be replayed only while its "
                        "landing files are kept."
                    ) from None
            item["amount"] = float(item["amount"])
            item["event_timestamp"] = _iso(when)
            events.append((when, 1, "transaction", item))
    if tables.silver_labels.is_dir():
        labels = ds.dataset(tables.silver_labels, format="parquet", partitioning="hive")
        stamp = pc.field("label_timestamp")
        rows = labels.to_table(
            columns=["transaction_id", "is_fraud", "label_timestamp"],
            filter=(stamp >= start) & (stamp < end) & (pc.field("is_fraud") == 1),
        ).to_pylist()
        for row in rows:
            when = row["label_timestamp"].astimezone(UTC)
            item = {"transaction_id": row["transaction_id"], "is_fraud": 1, "label_timestamp": _iso(when)}
            events.append((when, 0, "chargeback", item))
    events.sort(key=lambda e: (e[0], e[1], e[3]["transaction_id"]))
    return [(kind, item) for _, _, kind, item in events]


def _as_date(value: Any) -> date:
    return value if isinstance(value, date) else date.fromisoformat(str(value))


def original_ids(settings: Settings, arrivals: list[date]) -> dict[str, str]:
    """pseudonym -> raw id of every customer and merchant id in the transactions files that landed on
    `arrivals` (gzipped or not, any format: the ids are found by their contract patterns). An operator's
    tool: it needs the landing files and the pseudonym key, as ingestion does."""
    import gzip

    from pipelines.contracts import TRANSACTIONS_CONTRACT
    from pipelines.ingest.landing import data_format

    pseudonyms = pseudonym.for_settings(settings)
    tokens = {
        kind: re.compile(TRANSACTIONS_CONTRACT.field(column).raw_token())
        for column, kind in pseudonym.COLUMNS.items()
    }
    found: dict[str, str] = {}
    for arrival in arrivals:
        folder = settings.landing / arrival.isoformat()
        for path in sorted(folder.glob("transactions-*")) if folder.is_dir() else []:
            fmt, compressed = data_format(path.name)
            if fmt is None or not path.is_file():
                continue
            with (
                gzip.open(path, "rt", encoding="utf-8", errors="replace")
                if compressed
                else path.open(encoding="utf-8", errors="replace") as handle
            ):
                text = handle.read()
            for kind, token in tokens.items():
                for raw in set(token.findall(text)):
                    found[pseudonyms.of(kind, raw)] = raw
    return found


def drifted(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """The same events as new transactions (new ids, chargebacks following them) shifted as the generator's
    `drift` fault shifts a row (pipelines/synthetic/faults.py): a changed population, for showing
    monitoring at work."""
    import numpy as np

    from pipelines.contracts import AMOUNT_MAX
    from pipelines.synthetic.faults import DRIFT_CHANNEL, drift_amount

    def renamed(transaction_id: str) -> str:
        # new transactions, not retries of the day's: a scoring log keeps one row per transaction id
        return "tx" + hashlib.sha256(f"drift:{transaction_id}".encode()).hexdigest()[:16]

    out = []
    for kind, item in events:
        item = {**item, "transaction_id": renamed(item["transaction_id"])}
        if kind == "transaction":
            amount = min(float(drift_amount(np.array([item["amount"]]))[0]), AMOUNT_MAX)
            item = {**item, "amount": amount, "channel": DRIFT_CHANNEL}
        out.append((kind, item))
    return out


@dataclass
class ReplayReport:
    transactions: int = 0
    chargebacks: int = 0
    latencies_ms: list[float] = field(default_factory=list)  # client-side, one per scoring request
    results: list[dict[str, Any]] = field(default_factory=list)  # the service's answer per transaction
    seconds: float = 0.0

    def percentiles(self) -> dict[str, float]:
        import numpy as np

        if not self.latencies_ms:
            return {}
        values = np.asarray(self.latencies_ms)
        return {f"p{q}": float(np.percentile(values, q)) for q in (50, 90, 99)} | {"max": float(values.max())}


def replay_day(
    service: Running,
    settings: Settings,
    day: date,
    timeout_s: float = 30.0,
    events: list[tuple[str, dict[str, Any]]] | None = None,
) -> ReplayReport:
    """Post the day's events (or `events`) to the service one at a time, in order (see the module
    docstring), each with the token of its role. Raises RuntimeError naming the transaction and the
    service's answer when one is refused."""
    import httpx

    report = ReplayReport()
    started = time.perf_counter()
    chargebacks, scoring = service.headers("chargebacks"), service.headers("score")
    with httpx.Client(base_url=service.url, timeout=timeout_s) as client:
        for kind, item in day_events(settings, day) if events is None else events:
            if kind == "chargeback":
                answer = client.post("/chargebacks", json=item, headers=chargebacks)
                report.chargebacks += 1
            else:
                sent = time.perf_counter()
                answer = client.post("/score", json=item, headers=scoring)
                report.latencies_ms.append((time.perf_counter() - sent) * 1000.0)
                report.transactions += 1
            if answer.status_code != 200:
                raise RuntimeError(
                    f"the scoring service refused {kind} {item['transaction_id']} of {day} "
                    f"({answer.status_code}): {answer.text[:500]}"
                )
            if kind == "transaction":
                report.results.append(answer.json())
    report.seconds = time.perf_counter() - started
    return report
