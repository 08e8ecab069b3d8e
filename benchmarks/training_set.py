"""The retrain's training-set step at the goal's size (1M transactions a day, a 30-day window) without the
80-minute set-up of the end-to-end benchmark: a lake of per-date feature rows, silver footers and
chargebacks is written directly in the layouts training/feature_rows.py and the ingestion write (each
date's rows recorded fresh, so nothing is rebuilt), then, each in a fresh process:
  - the floor: a plain Arrow read of every column of the window's rows files, no filter;
  - `training.dataset.build_training_set`: the retrain's step (read, sample, label, write, DVC version);
with the page cache as the set-up left it (warm), then emptied before each (cold; needs root), as on a
retrain whose window the day's other jobs pushed out of memory. The goal (issue #21) is on the step.

The values are synthetic: ids, times spread over the day, features drawn like counts, amounts and ratios
with 5% missing, 2% of a date's rows arriving the next day, chargebacks at the synthetic feed's rate and
delays (pipelines/synthetic/simulate.py). The files come out about the size of the real feed's (~190 MB a
date against ~171 MB); the read's cost depends on rows, columns and bytes, not on the values.
Before the measured day, the day before's step runs once (`day_before`, not timed against the goal): as
on a daily retrain, the frauds known then are kept apart (training/feature_rows.WindowRows) and the
measured read decodes only the sample's row groups and those of the day's new chargebacks; the first read
of a lake decodes every group that holds a fraud, and `day_before` shows that cost.
A profile: `py-spy record -r 50 -f raw -o step.raw -- python -m benchmarks.training_set child step --home
DIR` on a lake a run left (`--keep`).
Run: `python -m benchmarks --only training_set` or `python -m benchmarks.training_set --scratch DIR`.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

STEP_GOAL_S = 15.0  # issue #21: the training-set build at 1M rows/day x 30 days
GOAL_SIZE = (1_000_000, 30)
LATE_SHARE = 0.02  # of a date's transactions arrive the next day


def _rows_of(day: date, rows: int, seed: int):
    """A date's feature rows, as training/feature_rows.build_date writes them (same columns and types)."""
    import numpy as np
    import pyarrow as pa

    from features.definitions import CUSTOMER_JOIN_KEY, MERCHANT_JOIN_KEY
    from training import feature_rows
    from training.dataset import SERVICE_FEATURES, TRANSACTION_INPUTS, unit_hash

    rng = np.random.default_rng(seed)
    ids = pa.array([f"tx-{day:%Y%m%d}-{i:08d}" for i in range(rows)], pa.string())
    start = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1_000_000)
    times = np.sort(start + rng.integers(0, 86_400_000_000, rows))
    columns: dict = {
        "transaction_id": ids,
        CUSTOMER_JOIN_KEY: pa.array([f"c{n:06d}" for n in rng.integers(0, 200_000, rows)], pa.string()),
        MERCHANT_JOIN_KEY: pa.array([f"m{n:05d}" for n in rng.integers(0, 20_000, rows)], pa.string()),
        "event_timestamp": pa.array(times, pa.timestamp("us", tz="UTC")),
    }
    for k, name in enumerate((*TRANSACTION_INPUTS, *SERVICE_FEATURES)):
        if k % 3 == 0:  # counts
            values = rng.poisson(3 + k, rows).astype("float64")
        elif k % 3 == 1:  # amounts in cents
            values = np.round(rng.lognormal(3, 1, rows), 2)
        else:  # means and ratios
            values = rng.random(rows)
        if k >= len(TRANSACTION_INPUTS):  # a feature is missing where the entity has no history
            values[rng.random(rows) < 0.05] = np.nan
        columns[name] = values
    late = rng.random(rows) < LATE_SHARE
    arrival = np.where(late, (day + timedelta(days=1)).isoformat(), day.isoformat())
    columns[feature_rows.ARRIVAL] = pa.array(arrival, pa.string())
    columns[feature_rows.ID_HASH] = unit_hash(ids)
    return pa.table(columns)


def build_lake(settings, last: date, days: int, rows: int, seed: int = 7) -> dict:
    """Feature rows of every event date of the window as of `last` (and the late-event day before it), the
    silver row counts per arrival, and the chargebacks reported through `last`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.lake import Tables, write_json
    from pipelines.synthetic.simulate import FRAUD_RATE, MAX_LABEL_DELAY_DAYS
    from training import feature_rows

    lake = settings.lake
    tables = Tables(lake)
    first = last - timedelta(days=days - 1)
    earliest = first - timedelta(days=settings.ingest.late_event_days)
    signatures = feature_rows._Signatures(lake)
    empty = {view.name: feature_rows._empty_carry(view) for view in feature_rows.VIEWS}
    per_arrival: dict[str, int] = {}
    frauds: list[tuple[str, str]] = []  # (transaction id, label arrival)
    rng = np.random.default_rng(seed)
    day = earliest
    while day <= last:
        table = _rows_of(day, rows, seed + day.toordinal())
        feature_rows._write(lake, day, table, empty)
        write_json(
            feature_rows._record_path(lake, day),
            {"event_date": day.isoformat(), "signature": signatures.of(day), "rows": table.num_rows},
        )
        arrivals, counts = np.unique(table[feature_rows.ARRIVAL].to_numpy(False), return_counts=True)
        for arrival, count in zip(arrivals, counts, strict=True):
            per_arrival[arrival] = per_arrival.get(arrival, 0) + int(count)
        chosen = np.flatnonzero(rng.random(rows) < FRAUD_RATE)
        # report delays as the synthetic feed draws them (lognormal, median 2.5 days, at most 30)
        delays = np.ceil(np.minimum(rng.lognormal(np.log(2.5), 0.8, len(chosen)), MAX_LABEL_DELAY_DAYS))
        ids = table["transaction_id"].take(pa.array(chosen)).to_pylist()
        frauds += [(i, (day + timedelta(days=int(d))).isoformat()) for i, d in zip(ids, delays, strict=True)]
        day += timedelta(days=1)
    for arrival, count in per_arrival.items():
        folder = tables.silver / f"arrival_date={arrival}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"event_date": pa.array([arrival] * count)}), folder / "part-00000.parquet")
    by_arrival: dict[str, list[str]] = {}
    for tx, arrival in frauds:
        by_arrival.setdefault(arrival, []).append(tx)
    for arrival, ids in by_arrival.items():
        if arrival > last.isoformat():
            continue
        folder = tables.silver_labels / f"arrival_date={arrival}"
        folder.mkdir(parents=True, exist_ok=True)
        stamp = datetime.fromisoformat(arrival).replace(hour=12, tzinfo=UTC)
        labels = pa.table(
            {
                "transaction_id": pa.array(ids, pa.string()),
                "is_fraud": pa.array([True] * len(ids)),
                "label_timestamp": pa.array([stamp] * len(ids), pa.timestamp("us", tz="UTC")),
            }
        )
        pq.write_table(labels, folder / "part-00000.parquet")
        write_json(tables.labels_reconciliation(date.fromisoformat(arrival)), {"files": ["labels.csv"]})
    return {"event_dates": (last - earliest).days + 1, "rows_per_date": rows, "frauds": len(frauds)}


def _drop_page_cache() -> bool:
    """Empty the kernel's page cache (root only), so that a read comes from the disk as on a retrain whose
    window the day's other jobs pushed out of memory. False where it cannot."""
    import os
    import subprocess

    knob = Path("/proc/sys/vm/drop_caches")
    if os.geteuid() != 0 or not knob.exists():
        return False
    subprocess.run(["sync"], check=True)
    try:
        knob.write_text("3\n")
    except OSError:
        return False
    return True


def _child(what: str, home: Path, last: date, days: int) -> dict:
    """`what` timed in a fresh process (imports included, as the retrain's task pays them)."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "benchmarks.training_set", "child", what, "--home", str(home),
               "--last", last.isoformat(), "--days", str(days)]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "MLOPS_HOME": str(home)}
    )
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "process_s": round(wall, 2)}


def _run_child(what: str, home: Path, last: date, days: int) -> dict:
    from core.settings import Settings

    settings = Settings(home=home)
    started = time.perf_counter()
    if what == "floor":  # every column of every row of the window's rows files, no filter: the read's floor
        from training import feature_rows

        rows = feature_rows.rows_dataset(settings.lake).to_table().num_rows
        return {"rows": rows, "seconds": round(time.perf_counter() - started, 2)}
    from training.dataset import build_training_set

    if what == "prefill":  # the retrain of the day before (over the lake's dates): its frauds kept apart
        last, days = last - timedelta(days=1), days - 1
    record = build_training_set(settings, last, days)
    return {"rows": record["rows"], "positives": record["positives"], "seconds": round(record["seconds"], 2),
            "negative_sample_rate": record.get("negative_sample_rate"),
            "read": record.get("read")}  # fmt: skip


def bench_training_set(
    sizes: list[int], scratch: Path, days: int = 30, last: date = date(2026, 2, 1), keep: bool = False
) -> list[dict]:
    """Per size (transactions a day): the lake's set-up, then the floor and the retrain's training-set step,
    each in a fresh process, with the page cache as the set-up left it (warm) and emptied (cold, as root)."""
    import shutil

    from core.settings import Settings

    results = []
    for rows in sizes:
        home = scratch / f"training-set-{rows}"
        started = time.perf_counter()
        made = build_lake(Settings(home=home), last, days, rows)
        set_up = round(time.perf_counter() - started, 1)
        # A daily retrain finds the frauds known the day before kept apart by that day's read; the first
        # read of a lake (this one) decodes every group holding a fraud.
        prefill = _child("prefill", home, last, days)
        kept_apart = home / "lake" / "state" / "training_rows_frauds"
        day_before = home / "frauds-as-of-the-day-before"
        shutil.copytree(kept_apart, day_before)
        result: dict = {"rows_per_day": rows, "days": days, "set_up_s": set_up, "day_before": prefill, **made}
        for cache in ("warm", "cold"):
            shutil.rmtree(kept_apart)  # each run starts from the day before's state
            shutil.copytree(day_before, kept_apart)
            if cache == "cold" and not _drop_page_cache():
                result["cold"] = "needs root to empty the page cache"
                continue
            floor = _child("floor", home, last, days)
            if cache == "cold":
                _drop_page_cache()
            step = _child("step", home, last, days)
            result[cache] = {
                "floor": floor,
                "step": step,
                "ratio": round(step["seconds"] / floor["seconds"], 2),
            }
        results.append(result)
        if not keep:
            shutil.rmtree(home, ignore_errors=True)
    return results


def print_training_set(console, results: list[dict]) -> None:
    from rich.table import Table

    columns = ("rows/day x days", "page cache", "Arrow read of the window (floor)", "training-set step")
    table = Table(*columns, "step / floor", "goal", "met?", title="Training set from per-date feature rows")
    for r in results:
        for cache in ("warm", "cold"):
            m = r.get(cache)
            if not isinstance(m, dict):
                table.add_row(f"{r['rows_per_day']:,} x {r['days']}", cache, str(m), "", "", "", "")
                continue
            step = m["step"]
            floor = m["floor"]
            at_goal_size = (r["rows_per_day"], r["days"]) == GOAL_SIZE
            table.add_row(
                f"{r['rows_per_day']:,} x {r['days']}",
                cache,
                f"{floor['seconds']:.1f} s ({floor['rows']:,} rows)",
                f"{step['seconds']:.1f} s ({step['rows']:,} kept; process {step['process_s']:.1f} s)",
                f"{m['ratio']:.2f}x",
                f"<= {STEP_GOAL_S:.0f} s" if at_goal_size else "(at 1M x 30)",
                ("yes" if step["seconds"] <= STEP_GOAL_S else "NO") if at_goal_size else "",
            )
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--home", type=Path, help="child: the lake to measure")
    parser.add_argument("--last", type=date.fromisoformat, default=date(2026, 2, 1))
    if argv[:1] == ["child"]:
        parser.add_argument("what", choices=["floor", "step", "prefill"])
        args = parser.parse_args(argv[1:])
        print(json.dumps(_run_child(args.what, args.home, args.last, args.days)))
        return
    parser.add_argument(
        "--scratch", type=Path, required=True, help="where the lake is set up (removed after)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the lake (for a profile or another commit)")
    args = parser.parse_args(argv)
    from rich.console import Console

    results = bench_training_set([args.rows], args.scratch, args.days, args.last, args.keep)
    print_training_set(Console(width=150), results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
