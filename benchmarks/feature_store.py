"""Feature store: materialization throughput into SQLite and Redis against a raw write of the same rows,
online retrieval latency, peak memory.

`bench_feature_store(sizes, scratch)` writes a gold day of `rows` customer rows (one entity per 10 rows)
and merchant rows (one per 1000), then, per online store, runs in a process of its own measured by
_measure.py (wall time, peak RSS of the process tree):
  - ours: `features.repo.apply` + `materialize` of the day, then online reads of 1 and 100 entities
    from a warm `features.online.OnlineFeatures`: its direct read and Feast's `get_online_features`
    with the same resolved service, beside the floor of a read (the same stored bytes fetched by one
    plain query per view or one Redis pipeline, not decoded), interleaved call by call;
  - the floor: the same latest-per-entity rows (computed beforehand, outside the timing) written into
    the same layout (Feast's SQLite table with its indexes, or Feast's Redis keys and hash fields) with
    sqlite3 executemany in key order under the same pragmas, or a Redis pipeline of HSETs (one hash per
    entity), in chunks of `features.materialize.WRITE_ROWS` entities.
Each figure comes with the 1-minute load average seen while it was taken (the machine is shared).
Run: `python -m benchmarks.feature_store --sizes 1000000` (or from benchmarks/__main__.py).
"""

from __future__ import annotations

import json
import math
import statistics
import struct
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
DAY = datetime(2026, 1, 7, tzinfo=UTC)
FILE_ROWS = 1_000_000
GOLD_ROW_GROUP_ROWS = 262_144


def write_gold_day(lake: Path, rows: int, seed: int = 0) -> None:
    """One gold date of both tables, deterministic, written in files of at most FILE_ROWS rows."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from features.definitions import INTEGER_FEATURES
    from pipelines.gold.contract import (
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
            # Laid out as gold is (pipelines/gold/job.py rewrites it with Arrow): row groups of
            # 262,144 rows, zstd, dictionaries for the entity key only.
            pq.write_table(
                pa.table(columns),
                folder / f"part-{part:05d}.parquet",
                row_group_size=GOLD_ROW_GROUP_ROWS,
                compression="zstd",
                use_dictionary=[key],
            )


def _percentiles(samples: list[float]) -> dict:
    samples = sorted(samples)
    return {
        "p50_ms": statistics.median(samples),
        "p99_ms": samples[math.ceil(len(samples) * 0.99) - 1],
        "max_ms": samples[-1],
        "calls": len(samples),
    }


def _latencies(calls: dict, repeats: int) -> dict:
    """Per-call latency of each of `calls`, the calls interleaved (one of each per round) so that every
    path sees the same moments of a shared machine's load."""
    for call in calls.values():
        for _ in range(10):  # warm caches and connections
            call()
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            call()
            samples[name].append((time.perf_counter() - started) * 1000)
    return {name: _percentiles(values) for name, values in samples.items()}


def run_ours(home: Path, profile: str, project: str) -> dict:
    import os

    os.environ["MLOPS_HOME"] = str(home)
    os.environ["MLOPS_PROFILE"] = profile
    from core.settings import Settings
    from features import materialize as materialization
    from features import online, repo

    settings = Settings()
    repo.apply(settings, project)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    cpu_started = time.process_time()
    reports = materialization.materialize(settings, DAY, DAY + timedelta(days=1), project)
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started
    load_after = os.getloadavg()[0]
    served = online.open_online(settings, project)
    customers = [f"c{i}" for i in range(0, 100_000, 1000)]
    one = [{"customer_id": customers[0], "merchant_id": "m0"}]
    hundred = [{"customer_id": c, "merchant_id": f"m{i}"} for i, c in enumerate(customers)]
    got = served.get(hundred)
    assert got["customer_txn_count_1h"][0] is not None, "benchmark entity not materialized"
    assert got == served.feast_get(hundred), "the direct read differs from Feast's"
    load_online = os.getloadavg()[0]

    def paths(rows: list[dict]) -> dict:
        return {
            "raw": _raw_read(settings, project, rows),
            "direct": lambda: served.get(rows),
            "feast": lambda: served.feast_get(rows),
        }

    latency_1 = _latencies(paths(one), 2000)
    latency_100 = _latencies(paths(hundred), 300)
    if profile == "cluster":
        repo.teardown(settings, project)
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "rows_scanned": sum(r.rows_scanned for r in reports),
        "rows_written": sum(r.rows_written for r in reports),
        "load_materialize": (load_before + load_after) / 2,
        "load_online": (load_online + os.getloadavg()[0]) / 2,
        "online_1": latency_1,
        "online_100": latency_100,
    }


def _raw_read(settings, project: str, rows: list[dict]):
    """The floor of a read: the same stored bytes of the same entities fetched with the plainest client
    call (one SQLite query per view, or one Redis pipeline of HMGETs), nothing decoded."""
    import mmh3

    from features.definitions import CUSTOMER_VIEW, MERCHANT_VIEW
    from pipelines.gold.contract import CUSTOMER_FEATURES, MERCHANT_FEATURES

    views = [
        (CUSTOMER_VIEW, [_entity_key("customer_id", r["customer_id"]) for r in rows], CUSTOMER_FEATURES),
        (MERCHANT_VIEW, [_entity_key("merchant_id", r["merchant_id"]) for r in rows], MERCHANT_FEATURES),
    ]
    if settings.profile.value == "local":
        import sqlite3

        conn = sqlite3.connect(settings.feast_dir / "online.db")
        queries = [
            (
                f"SELECT entity_key, feature_name, value FROM {project}_{view} "
                f"WHERE entity_key IN ({','.join('?' * len(keys))})",
                keys,
            )
            for view, keys, _ in views
        ]
        return lambda: [conn.execute(sql, keys).fetchall() for sql, keys in queries]
    import redis

    client = redis.Redis.from_url(settings.cluster.redis_url)
    commands = [
        (
            key + project.encode(),
            [struct.pack("<I", mmh3.hash(f"{view}:{f}", signed=False)) for f in features],
        )
        for view, keys, features in views
        for key in keys
    ]

    def read() -> list:
        with client.pipeline(transaction=False) as pipe:
            for key, fields in commands:
                pipe.hmget(key, fields)
            return pipe.execute()

    return read


def _latest_rows(lake: Path):
    """The rows materialization writes: per entity, its latest gold row of the day (held in memory)."""
    import pyarrow.dataset as ds

    from pipelines.gold.contract import CUSTOMER_TABLE, MERCHANT_TABLE, table_path

    out = {}
    for table, key in ((CUSTOMER_TABLE, "customer_id"), (MERCHANT_TABLE, "merchant_id")):
        dataset = ds.dataset(table_path(lake, table), format="parquet", partitioning="hive")
        frame = dataset.to_table().to_pandas()
        frame = frame.sort_values(["event_timestamp", "created_timestamp"]).drop_duplicates(key, keep="last")
        out[table] = (key, frame.drop(columns=["event_date"]))
    return out


def _entity_key(join_key: str, value: str) -> bytes:
    """Feast's serialized entity key (version 3) of one string join key, written out by hand."""
    name, data = join_key.encode(), value.encode()
    return struct.pack("<III", 1, 2, len(name)) + name + struct.pack("<II", 2, len(data)) + data


def run_baseline(home: Path, target: str, redis_url: str, project: str) -> dict:
    """The same rows, in the same layout Feast reads (SQLite: its table, with its two indexes; Redis: its
    keys and hash fields), written the plainest way: SQLite executemany per chunk of entities in key order
    with the pragmas the materialization uses, or a Redis pipeline of HSETs. Values are packed here the
    way a hand-written loader would (struct, str), inside the timing."""
    import os

    from features.materialize import WRITE_ROWS

    tables = _latest_rows(home / "lake")
    chunk = WRITE_ROWS
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    cpu_started = time.process_time()
    written = 0
    if target == "sqlite":
        import sqlite3

        upsert = (
            "INSERT INTO {table} (entity_key, feature_name, value, value_text, event_ts, created_ts) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(entity_key, feature_name) DO UPDATE SET value = "
            "excluded.value, value_text = excluded.value_text, event_ts = excluded.event_ts, "
            "created_ts = excluded.created_ts"
        )
        conn = sqlite3.connect(home / "baseline.db")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA cache_size=-65536")
        for table, (key, frame) in tables.items():
            # Feast 0.67's table (SqliteOnlineStore.update), index included.
            conn.execute(
                f"CREATE TABLE {table} (entity_key BLOB, feature_name TEXT, value BLOB, value_text TEXT, "
                "vector_value BLOB, event_ts timestamp, created_ts timestamp, "
                "PRIMARY KEY(entity_key, feature_name))"
            )
            conn.execute(f"CREATE INDEX {table}_ek ON {table} (entity_key)")
            features = [c for c in frame.columns if c not in (key, "event_timestamp", "created_timestamp")]
            integers = {c for c in features if frame[c].dtype.kind == "i"}
            for offset in range(0, len(frame), chunk):
                part = frame.iloc[offset : offset + chunk]
                keys = [_entity_key(key, k) for k in part[key].tolist()]
                order = sorted(range(len(keys)), key=keys.__getitem__)
                events = (_micros(part["event_timestamp"]) // 10**6).tolist()
                created = (_micros(part["created_timestamp"]) // 10**6).tolist()
                columns = {name: part[name].tolist() for name in features}
                rows = []
                for i in order:
                    for name in features:
                        v = columns[name][i]
                        packed = b" " + _varint(v) if name in integers else b")" + struct.pack("<d", v)
                        rows.append((keys[i], name, packed, str(v), events[i], created[i]))
                with conn:
                    conn.executemany(upsert.format(table=table), rows)
                written += len(part)
        conn.close()
    else:
        import mmh3
        import redis

        client = redis.Redis.from_url(redis_url)
        suffix = project.encode()
        for key, frame in tables.values():
            view = "customer_stats_fv" if key == "customer_id" else "merchant_stats_fv"
            features = [c for c in frame.columns if c not in (key, "event_timestamp", "created_timestamp")]
            integers = {c for c in features if frame[c].dtype.kind == "i"}
            fields = {name: struct.pack("<I", mmh3.hash(f"{view}:{name}", signed=False)) for name in features}
            for offset in range(0, len(frame), chunk):
                part = frame.iloc[offset : offset + chunk]
                columns = {name: part[name].tolist() for name in features}
                micros = _micros(part["event_timestamp"]).tolist()
                with client.pipeline(transaction=False) as pipe:
                    for i, entity in enumerate(part[key].tolist()):
                        mapping = {
                            fields[name]: (
                                b" " + _varint(columns[name][i])
                                if name in integers
                                else b")" + struct.pack("<d", columns[name][i])
                            )
                            for name in features
                        }
                        seconds, rest = divmod(micros[i], 10**6)
                        mapping[f"_ts:{view}"] = b"\x08" + _varint(seconds) + b"\x10" + _varint(rest * 1000)
                        pipe.hset(_entity_key(key, entity) + suffix, mapping=mapping)
                    pipe.execute()
                written += len(part)
        keys = list(client.scan_iter(match=b"*" + suffix, count=10_000))
        for offset in range(0, len(keys), 10_000):
            client.delete(*keys[offset : offset + 10_000])
    return {
        "seconds": time.perf_counter() - started,
        "cpu_seconds": time.process_time() - cpu_started,
        "rows_written": written,
        "load": (load_before + os.getloadavg()[0]) / 2,
    }


def _micros(times):
    return times.dt.as_unit("us").astype("int64")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def bench_feature_store(sizes: list[int], scratch: Path) -> list[dict]:
    import shutil

    from core.settings import Settings

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
            online_1, online_100 = run["online_1"], run["online_100"]
            results.append(
                {
                    "store": target,
                    "gold_rows": run["rows_scanned"],
                    "rows_written": run["rows_written"],
                    "seconds": run["seconds"],
                    "cpu_seconds": run["cpu_seconds"],
                    "scanned_rows_per_s": run["rows_scanned"] / run["seconds"],
                    "written_rows_per_s": run["rows_written"] / run["seconds"],
                    "baseline_seconds": floor["seconds"],
                    "baseline_cpu_seconds": floor["cpu_seconds"],
                    "baseline_rows_per_s": floor["rows_written"] / floor["seconds"],
                    "write_ratio": (run["rows_written"] / run["seconds"])
                    / (floor["rows_written"] / floor["seconds"]),
                    "load_materialize": run["load_materialize"],
                    "load_baseline": floor["load"],
                    "load_online": run["load_online"],
                    **{
                        f"online_{n}_{path}_{stat}": latency[path][f"{stat}_ms"]
                        for n, latency in ((1, online_1), (100, online_100))
                        for path in ("raw", "direct", "feast")
                        for stat in ("p50", "p99")
                    },
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
        "s (cpu s)",
        "gold rows/s",
        "written rows/s",
        "raw write rows/s",
        "ours / raw",
        "load 1m",
        "peak MiB (raw)",
        title="feature store materialization of one day vs a raw write of the same rows into the same layout "
        "(goal: >= 100k gold rows/s); load 1m: the 1-minute load average during ours / the raw write",
    )
    for r in results:
        table.add_row(
            r["store"],
            f"{r['gold_rows']:,}",
            f"{r['rows_written']:,}",
            f"{r['seconds']:.1f} ({r['cpu_seconds']:.1f})",
            f"{r['scanned_rows_per_s']:,.0f}",
            f"{r['written_rows_per_s']:,.0f}",
            f"{r['baseline_rows_per_s']:,.0f}",
            f"{r['write_ratio']:.2f}x",
            f"{r['load_materialize']:.1f} / {r['load_baseline']:.1f}",
            f"{r['peak_mib']:.0f} ({r['baseline_peak_mib']:.0f})",
        )
    console.print(table)
    latency = Table(
        "store",
        "1 entity raw",
        "1 entity direct",
        "1 entity Feast",
        "100 entities raw",
        "100 entities direct",
        "100 entities Feast",
        "load 1m",
        title="online retrieval p50 / p99 ms, warm store, calls back to back, the three paths interleaved; "
        "raw: the same stored bytes fetched by one plain query per view or one Redis pipeline, not decoded "
        "(goal: 1-entity p99 <= 5 ms SQLite, <= 3 ms Redis)",
    )
    for r in results:
        latency.add_row(
            r["store"],
            *(
                f"{r[f'online_{n}_{path}_p50']:.2f} / {r[f'online_{n}_{path}_p99']:.2f}"
                for n in (1, 100)
                for path in ("raw", "direct", "feast")
            ),
            f"{r['load_online']:.1f}",
        )
    console.print(latency)


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
