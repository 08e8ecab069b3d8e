"""Feature store: materialization throughput into SQLite and Redis against a raw write of the same rows,
online retrieval latency, peak memory.

`bench_feature_store(sizes, scratch)` writes a gold day of `rows` customer rows (one entity per 10 rows)
and merchant rows (one per 1000), then, per online store, runs in a process of its own measured by
_measure.py (wall time, peak RSS of the process tree):
  - ours: `features.store.apply` + `materialize` of the day, then online reads of 1 and 100 entities;
  - the floor: the same latest-per-entity rows (computed beforehand, outside the timing) written with
    sqlite3 executemany (one row per entity and feature, Feast's table layout) or a Redis pipeline of
    HSETs (one hash per entity), in chunks of 20k entities.
Run: `python -m benchmarks.feature_store --sizes 1000000` (or from benchmarks/__main__.py).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
DAY = datetime(2026, 1, 7, tzinfo=UTC)
FILE_ROWS = 1_000_000


def write_gold_day(lake: Path, rows: int, seed: int = 0) -> None:
    """One gold date of both tables, deterministic, written in files of at most FILE_ROWS rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from features.definitions import INTEGER_FEATURES
    from pipelines.features.contract import (
        CUSTOMER_FEATURES,
        CUSTOMER_TABLE,
        MERCHANT_FEATURES,
        MERCHANT_TABLE,
        table_path,
    )

    rng = np.random.default_rng(seed)
    start_us = int(DAY.timestamp() * 1e6)
    for table, key, features, per_entity in (
        (CUSTOMER_TABLE, "customer_id", CUSTOMER_FEATURES, 10),
        (MERCHANT_TABLE, "merchant_id", MERCHANT_FEATURES, 1000),
    ):
        folder = table_path(lake, table) / f"event_date={DAY.date().isoformat()}"
        folder.mkdir(parents=True, exist_ok=True)
        entities = max(1, rows // per_entity)
        for part, offset in enumerate(range(0, rows, FILE_ROWS)):
            n = min(FILE_ROWS, rows - offset)
            ids = rng.integers(0, entities, size=n)
            event = np.sort(rng.integers(start_us, start_us + 86_400_000_000, size=n))
            columns = {
                key: pa.array(np.char.add(key[0], ids.astype("U12"))),
                "event_timestamp": pa.array(event, type=pa.timestamp("us", tz="UTC")),
                "created_timestamp": pa.array(event + 3_600_000_000, type=pa.timestamp("us", tz="UTC")),
            }
            for name in features:
                if name in INTEGER_FEATURES:
                    columns[name] = pa.array(rng.integers(0, 50, size=n))
                else:
                    columns[name] = pa.array(rng.gamma(2.0, 40.0, size=n))
            pq.write_table(pa.table(columns), folder / f"part-{part:05d}.parquet")


def _latencies(call, repeats: int) -> dict:
    for _ in range(10):  # warm caches and connections
        call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"p50_ms": statistics.median(samples), "p99_ms": samples[int(len(samples) * 0.99) - 1]}


def run_ours(home: Path, profile: str, project: str) -> dict:
    import os

    os.environ["MLOPS_HOME"] = str(home)
    os.environ["MLOPS_PROFILE"] = profile
    from features import store
    from mlops.settings import Settings

    settings = Settings()
    store.apply(settings, project)
    started = time.perf_counter()
    reports = store.materialize(settings, DAY, DAY + timedelta(days=1), project)
    seconds = time.perf_counter() - started
    fs = store.open_store(settings, project)
    customers = [f"c{i}" for i in range(0, 100_000, 1000)]
    one = [{"customer_id": customers[0], "merchant_id": "m0"}]
    hundred = [{"customer_id": c, "merchant_id": f"m{i}"} for i, c in enumerate(customers)]
    got = store.online_features(settings, one, project, store=fs)
    assert got["customer_txn_count_1h"][0] is not None, "benchmark entity not materialized"
    latency_1 = _latencies(lambda: store.online_features(settings, one, project, store=fs), 500)
    latency_100 = _latencies(lambda: store.online_features(settings, hundred, project, store=fs), 200)
    if profile == "cluster":
        store.teardown(settings, project)
    return {
        "seconds": seconds,
        "rows_scanned": sum(r.rows_scanned for r in reports),
        "rows_written": sum(r.rows_written for r in reports),
        "online_1": latency_1,
        "online_100": latency_100,
    }


def _latest_rows(lake: Path):
    """The rows materialization writes: per entity, its latest gold row of the day (held in memory)."""
    import pyarrow.dataset as ds

    from pipelines.features.contract import CUSTOMER_TABLE, MERCHANT_TABLE, table_path

    out = {}
    for table, key in ((CUSTOMER_TABLE, "customer_id"), (MERCHANT_TABLE, "merchant_id")):
        dataset = ds.dataset(table_path(lake, table), format="parquet", partitioning="hive")
        frame = dataset.to_table().to_pandas()
        frame = frame.sort_values(["event_timestamp", "created_timestamp"]).drop_duplicates(key, keep="last")
        out[table] = (key, frame.drop(columns=["event_date"]))
    return out


def run_baseline(home: Path, target: str, redis_url: str, project: str) -> dict:
    import struct

    tables = _latest_rows(home / "lake")
    chunk = 20_000
    started = time.perf_counter()
    written = 0
    if target == "sqlite":
        import sqlite3

        conn = sqlite3.connect(home / "baseline.db")
        for table, (key, frame) in tables.items():
            conn.execute(
                f"CREATE TABLE {table} (entity_key BLOB, feature_name TEXT, value BLOB, event_ts TIMESTAMP, "
                "created_ts TIMESTAMP, PRIMARY KEY(entity_key, feature_name))"
            )
            features = [c for c in frame.columns if c not in (key, "event_timestamp", "created_timestamp")]
            for offset in range(0, len(frame), chunk):
                part = frame.iloc[offset : offset + chunk]
                keys = part[key].str.encode("utf-8").tolist()
                events = part["event_timestamp"].dt.tz_localize(None).astype(str).tolist()
                created = part["created_timestamp"].dt.tz_localize(None).astype(str).tolist()
                with conn:
                    for name in features:
                        values = [struct.pack("<d", float(v)) for v in part[name].tolist()]
                        conn.executemany(
                            f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?) "
                            "ON CONFLICT(entity_key, feature_name) DO UPDATE SET value = excluded.value, "
                            "event_ts = excluded.event_ts, created_ts = excluded.created_ts",
                            zip(keys, [name] * len(keys), values, events, created, strict=True),
                        )
                written += len(part)
        conn.close()
    else:
        import redis

        client = redis.Redis.from_url(redis_url)
        for key, frame in tables.values():
            features = [c for c in frame.columns if c not in (key, "event_timestamp", "created_timestamp")]
            for offset in range(0, len(frame), chunk):
                part = frame.iloc[offset : offset + chunk]
                columns = {name: part[name].tolist() for name in features}
                events = part["event_timestamp"].astype("int64").tolist()
                with client.pipeline(transaction=False) as pipe:
                    for i, entity in enumerate(part[key].tolist()):
                        mapping = {name: struct.pack("<d", float(columns[name][i])) for name in features}
                        mapping["_ts"] = struct.pack("<q", events[i])
                        pipe.hset(f"{project}:{entity}", mapping=mapping)
                    pipe.execute()
                written += len(part)
        keys = list(client.scan_iter(match=f"{project}:*", count=10_000))
        for offset in range(0, len(keys), 10_000):
            client.delete(*keys[offset : offset + 10_000])
    return {"seconds": time.perf_counter() - started, "rows_written": written}


def bench_feature_store(sizes: list[int], scratch: Path) -> list[dict]:
    import shutil

    from mlops.settings import Settings

    redis_url = Settings().cluster.redis_url
    results = []
    for rows in sizes:
        home = scratch / f"feast-{rows}"
        write_gold_day(home / "lake", rows)
        for profile, target in (("local", "sqlite"), ("cluster", "redis")):
            project = f"bench_{uuid.uuid4().hex[:8]}"
            script = [sys.executable, "-m", "benchmarks.feature_store"]
            ours = measure([*script, "ours", str(home), profile, project])
            base = measure([*script, "baseline", str(home), target, redis_url, project])
            run, floor = ours["output"], base["output"]
            results.append(
                {
                    "store": target,
                    "gold_rows": run["rows_scanned"],
                    "rows_written": run["rows_written"],
                    "seconds": run["seconds"],
                    "scanned_rows_per_s": run["rows_scanned"] / run["seconds"],
                    "written_rows_per_s": run["rows_written"] / run["seconds"],
                    "baseline_seconds": floor["seconds"],
                    "baseline_rows_per_s": floor["rows_written"] / floor["seconds"],
                    "write_ratio": (run["rows_written"] / run["seconds"])
                    / (floor["rows_written"] / floor["seconds"]),
                    "online_1_p50_ms": run["online_1"]["p50_ms"],
                    "online_1_p99_ms": run["online_1"]["p99_ms"],
                    "online_100_p50_ms": run["online_100"]["p50_ms"],
                    "online_100_p99_ms": run["online_100"]["p99_ms"],
                    "peak_mib": ours["peak_mib"],
                    "baseline_peak_mib": base["peak_mib"],
                }
            )
            for leftover in (home / "feast", home / "baseline.db"):
                if leftover.is_dir():
                    shutil.rmtree(leftover)
                elif leftover.exists():
                    leftover.unlink()
        shutil.rmtree(home)
    return results


def print_feature_store(console, results: list[dict]) -> None:
    from rich.table import Table

    table = Table(
        "store",
        "gold rows",
        "written",
        "s",
        "gold rows/s",
        "written rows/s",
        "raw write rows/s",
        "ours / raw",
        "1 ent p50/p99 ms",
        "100 ent p50/p99 ms",
        "peak MiB",
        "raw peak MiB",
        title="feature store materialization of one day vs a raw write of the same rows "
        "(goals: >= 100k gold rows/s; 1-entity p99 <= 5 ms SQLite, <= 3 ms Redis)",
    )
    for r in results:
        table.add_row(
            r["store"],
            f"{r['gold_rows']:,}",
            f"{r['rows_written']:,}",
            f"{r['seconds']:.1f}",
            f"{r['scanned_rows_per_s']:,.0f}",
            f"{r['written_rows_per_s']:,.0f}",
            f"{r['baseline_rows_per_s']:,.0f}",
            f"{r['write_ratio']:.2f}x",
            f"{r['online_1_p50_ms']:.2f} / {r['online_1_p99_ms']:.2f}",
            f"{r['online_100_p50_ms']:.2f} / {r['online_100_p99_ms']:.2f}",
            f"{r['peak_mib']:.0f}",
            f"{r['baseline_peak_mib']:.0f}",
        )
    console.print(table)


def main() -> None:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(prog="python -m benchmarks.feature_store")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("ours").add_argument("args", nargs=3)
    sub.add_parser("baseline").add_argument("args", nargs=4)
    parser.add_argument("--sizes", default="1000000")
    args = parser.parse_args()
    if args.command == "ours":
        home, profile, project = args.args
        print(json.dumps(run_ours(Path(home), profile, project)))
    elif args.command == "baseline":
        home, target, redis_url, project = args.args
        print(json.dumps(run_baseline(Path(home), target, redis_url, project)))
    else:
        from rich.console import Console

        with tempfile.TemporaryDirectory(prefix="mlops-bench-") as scratch:
            results = bench_feature_store([int(s) for s in args.sizes.split(",")], Path(scratch))
        print_feature_store(Console(width=180), results)
        print(json.dumps(results))


if __name__ == "__main__":
    main()
