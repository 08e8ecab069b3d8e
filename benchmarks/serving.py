"""The scoring service under load from a client on 127.0.0.1, against Feast's own feature server and the
in-process floor, in one run on one machine.

Set-up (real pipeline, in a scratch MLOPS_HOME): `mlops generate` two days, `mlops ingest` and
`mlops features` each (silver, gold, the SQLite online store materialized), and a FraudMLP exported to ONNX
and registered as the champion (untrained: latency does not depend on the weights). The second day's
transactions are the traffic; the service runs with its live state taking over at that day's start.

Measured (each load bounded by a request count and a time limit):
  - end-to-end latency of one transaction at a fixed arrival rate (open loop: latency counts from the
    scheduled send time, so a stalled server cannot hide queued requests), through `mlops serve`:
    HTTP + validation + features + model + scoring log;
  - the same rate against `feast serve` answering the same feature request (fraud_model_v1 for the
    transaction's customer and merchant): HTTP + features only;
  - the in-process floor: the online store read of the two entities and the ONNX call, no HTTP;
  - throughput with many requests in flight (closed loop), with micro-batching and without (batch 1);
  - the scoring log's cost: the same throughput run with the log off.
Goals (ISSUE 19): p99 <= 5 ms at 500 requests/s with features; >= 2,000 transactions/s with batching; the
scoring log costs <= 5 %. Printed beside the figures, never asserted.

Run: `python -m benchmarks.serving [--rows-per-day 20000] [--rate 500] [--seconds 20]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np

START = date(2026, 3, 2)
MLOPS = str(Path(sys.executable).with_name("mlops"))
FEAST = str(Path(sys.executable).with_name("feast"))


def _run(args: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(args, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def set_up(home: Path, rows_per_day: int) -> dict[str, str]:
    env = {**os.environ, "MLOPS_HOME": str(home), "MLOPS_PROFILE": "local"}
    days = [START, START + timedelta(days=1)]
    _run(
        [MLOPS, "generate", "--start", START.isoformat(), "--days", "2", "--rows-per-day", str(rows_per_day)],
        env,
    )
    for day in days:
        _run([MLOPS, "ingest", "--date", day.isoformat()], env)
        _run([MLOPS, "features", "--date", day.isoformat()], env)
    _run([sys.executable, "-m", "benchmarks.serving", "--register-champion", str(home)], env)
    return env


def register_champion(home: Path) -> None:
    """An untrained FraudMLP (normalisation fitted on noise), logged, exported to ONNX and made champion."""
    import mlflow
    import torch

    from core.settings import Settings
    from training.artifacts import log_model
    from training.dataset import MODEL_INPUTS, NUMERIC_FEATURES
    from training.export import to_onnx
    from training.model import FraudMLP
    from training.registry import ModelRegistry

    settings = Settings()
    settings.ensure_dirs()
    torch.manual_seed(0)
    model = FraudMLP()
    model.fit_normalization(torch.randn(1000, len(NUMERIC_FEATURES)))
    model.eval()
    mlflow.set_tracking_uri(settings.mlflow_tracking_uri)
    if mlflow.get_experiment_by_name("serving-benchmark") is None:  # artifacts under the home, not the cwd
        mlflow.create_experiment(
            "serving-benchmark", artifact_location=(settings.mlflow_dir / "artifacts").as_uri()
        )
    mlflow.set_experiment("serving-benchmark")
    with mlflow.start_run() as run:
        log_model(model, name="model", pip_requirements=[])
        with tempfile.TemporaryDirectory() as scratch:
            path = to_onnx(model, torch.zeros(2, len(MODEL_INPUTS)), Path(scratch) / "model.onnx")
            mlflow.log_artifact(str(path), "onnx")
    registry = ModelRegistry(settings.mlflow_tracking_uri)
    registry.set_champion(registry.register(run.info.run_id))


def traffic(home: Path, day: date) -> list[dict]:
    from serving.replay import day_events

    return [item for kind, item in day_events(home / "lake", day) if kind == "transaction"]


# --- a small HTTP/1.1 load generator (keep-alive connections, raw bytes: the client must cost little) ------


def _request(path: str, body: bytes, token: str | None = None) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return status


async def _open_loop(port: int, requests: list[bytes], rate: float, limit_s: float, connections: int) -> dict:
    """Send requests at `rate` per second on a pool of connections; latency from the scheduled time."""
    pool: asyncio.Queue = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    failures = 0
    start = loop.time() + 0.05

    async def one(raw: bytes, due: float) -> None:
        nonlocal failures
        connection = await pool.get()
        try:
            status = await _exchange(*connection, raw)
            failures += status != 200
        finally:
            pool.put_nowait(connection)
        latencies.append((loop.time() - due) * 1000.0)

    tasks = []
    for i, raw in enumerate(requests):
        due = start + i / rate
        if due - start > limit_s:
            break
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(raw, due)))
    await asyncio.gather(*tasks)
    elapsed = loop.time() - start
    while not pool.empty():
        pool.get_nowait()[1].close()
    values = np.asarray(latencies)
    return {
        "requests": len(latencies),
        "failures": failures,
        "offered_rate": rate,
        "achieved_rate": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
    }


async def _closed_loop(
    port: int, requests: list[bytes], in_flight: int, limit_s: float, per_request: int
) -> dict:
    """`in_flight` connections each sending its next request when the last answered."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    cursor = iter(requests)
    done = failures = 0
    started = loop.time()

    async def worker() -> None:
        nonlocal done, failures
        connection = await asyncio.open_connection("127.0.0.1", port)
        try:
            for raw in cursor:
                if loop.time() > deadline:
                    break
                status = await _exchange(*connection, raw)
                done += 1
                failures += status != 200
        finally:
            connection[1].close()

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    elapsed = loop.time() - started
    return {
        "requests": done,
        "failures": failures,
        "in_flight": in_flight,
        "transactions_per_s": done * per_request / elapsed,
    }


# --- the servers --------------------------------------------------------------------------------------------


class Process:
    def __init__(self, args: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115 (lives with the process)
        self.process = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_http(self, port: int, path: str, timeout: float = 120.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited: {Path(self.log.name).read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"no answer on {path} in {timeout} s: {Path(self.log.name).read_text()[-3000:]}")

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(timeout=60)


def _port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(env: dict[str, str], day: date, **serving: str) -> tuple[Process, int]:
    port = _port()
    extra = {f"MLOPS_SERVING__{k.upper()}": v for k, v in serving.items()}
    process = Process(
        [MLOPS, "serve", "--port", str(port), "--live-from", f"{day.isoformat()}T00:00:00"], {**env, **extra}
    )
    process.wait_http(port, "/v2/health/ready")
    return process, port


def floor(home: Path, items: list[dict], count: int) -> dict:
    """The in-process floor: the online store read of the transaction's two entities and one ONNX call."""
    from core.settings import Settings
    from features.online import open_online
    from serving.models import ModelSource

    settings = Settings(home=home)
    online = open_online(settings)
    from training.dataset import MODEL_INPUTS

    source = ModelSource(settings.mlflow_tracking_uri)
    model = source.load(source.champion() or "1")
    x = np.zeros((1, len(MODEL_INPUTS)), dtype="float32")
    timings = []
    for item in items[:count]:
        started = time.perf_counter()
        online.get([{"customer_id": item["customer_id"], "merchant_id": item["merchant_id"]}])
        model.score(x)
        timings.append((time.perf_counter() - started) * 1000.0)
    values = np.asarray(timings)
    return {
        "requests": len(values),
        "p50_ms": float(np.percentile(values, 50)),
        "p99_ms": float(np.percentile(values, 99)),
    }


def run(rows_per_day: int, rate: float, seconds: float, scratch: Path | None = None) -> dict:
    scratch = scratch or Path(tempfile.mkdtemp(prefix="bench-serving-"))
    home = scratch / "serving-home"
    env = set_up(home, rows_per_day)
    day = START + timedelta(days=1)
    items = traffic(home, day)
    count = int(rate * seconds)
    # The scoring service's callers present a token (serving/auth.py): the local profile's generated file.
    from core.settings import Settings
    from serving.auth import open_callers, token_for

    open_callers(Settings(home=home))
    token = token_for(Settings(home=home), "score")
    score_requests = [_request("/score", json.dumps(i).encode(), token) for i in items]
    results: dict = {"rows_per_day": rows_per_day, "traffic": len(items)}

    # end-to-end at a fixed rate, one transaction per request
    service, port = serve(env, day)
    try:
        results["service_open_loop"] = asyncio.run(
            _open_loop(port, score_requests[:count], rate, seconds, 32)
        )
    finally:
        service.stop()

    # Feast's feature server on the same store, the same entities
    feast_requests = [
        _request(
            "/get-online-features",
            json.dumps(
                {
                    "feature_service": "fraud_model_v1",
                    "entities": {"customer_id": [i["customer_id"]], "merchant_id": [i["merchant_id"]]},
                }
            ).encode(),
        )
        for i in items
    ]
    port = _port()
    feast = Process(
        [FEAST, "serve", "--port", str(port), "--no-access-log", "--max-requests", "10000000"],
        env,
        cwd=home / "feast",
    )
    try:
        feast.wait_http(port, "/health")
        results["feast_serve_open_loop"] = asyncio.run(
            _open_loop(port, feast_requests[:count], rate, seconds, 32)
        )
    finally:
        feast.stop()

    results["in_process_floor"] = floor(home, items, min(count, 5000))

    # throughput: micro-batching on and off, and the scoring log's cost
    for name, settings in (
        ("batched", {"max_batch_size": "64", "max_wait_ms": "1"}),
        ("batched_no_log", {"max_batch_size": "64", "max_wait_ms": "1", "scoring_log": "false"}),
        ("unbatched", {"max_batch_size": "1", "max_wait_ms": "0"}),
    ):
        service, port = serve(env, day, **settings)
        try:
            results[f"throughput_{name}"] = asyncio.run(_closed_loop(port, score_requests, 64, seconds, 1))
        finally:
            service.stop()
    batched = results["throughput_batched"]["transactions_per_s"]
    results["batching_speedup"] = batched / results["throughput_unbatched"]["transactions_per_s"]
    results["scoring_log_cost"] = 1 - batched / results["throughput_batched_no_log"]["transactions_per_s"]
    results["p99_ratio_vs_feast_serve"] = (
        results["service_open_loop"]["p99_ms"] / results["feast_serve_open_loop"]["p99_ms"]
    )
    results["goals"] = {
        "p99_ms_at_rate<=5": results["service_open_loop"]["p99_ms"] <= 5.0,
        "batched_tps>=2000": batched >= 2000,
        "scoring_log_cost<=5%": results["scoring_log_cost"] <= 0.05,
    }
    results["load_average"] = os.getloadavg()[0]
    return results


def print_serving(console, results: dict) -> None:
    from rich.table import Table

    table = Table(
        "measure",
        "value",
        "goal",
        title=f"scoring service ({results['rows_per_day']} rows/day, load {results['load_average']:.1f})",
    )
    service, feast, floor_ = (
        results["service_open_loop"],
        results["feast_serve_open_loop"],
        results["in_process_floor"],
    )
    rate = service["offered_rate"]
    table.add_row(
        f"mlops serve p50 / p99 at {rate:.0f}/s",
        f"{service['p50_ms']:.2f} / {service['p99_ms']:.2f} ms",
        "p99 <= 5 ms",
    )
    table.add_row(
        f"feast serve p50 / p99 at {rate:.0f}/s", f"{feast['p50_ms']:.2f} / {feast['p99_ms']:.2f} ms", ""
    )
    table.add_row("in-process floor p50 / p99", f"{floor_['p50_ms']:.3f} / {floor_['p99_ms']:.3f} ms", "")
    table.add_row("p99 ratio mlops serve / feast serve", f"{results['p99_ratio_vs_feast_serve']:.2f}", "")
    for name in ("batched", "batched_no_log", "unbatched"):
        figures = results[f"throughput_{name}"]
        table.add_row(
            f"throughput {name}",
            f"{figures['transactions_per_s']:.0f} tx/s ({figures['failures']} failed)",
            ">= 2000 batched" if name == "batched" else "",
        )
    table.add_row("batching speed-up", f"{results['batching_speedup']:.2f}x", "")
    table.add_row("scoring log cost", f"{results['scoring_log_cost']:.1%}", "<= 5 %")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows-per-day", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--register-champion", type=Path, default=None)
    args = parser.parse_args()
    if args.register_champion:
        register_champion(args.register_champion)
        return
    from rich.console import Console

    results = run(args.rows_per_day, args.rate, args.seconds)
    print(json.dumps(results, indent=2))
    print_serving(Console(width=150, stderr=True), results)


if __name__ == "__main__":
    main()
