"""The Spark gold job: what 30 days of lookback cost over none, and its peak memory.

Both benchmarks share one silver history per size: `rows` transactions a day for 31 arrival dates, landed by
the generator (no faults) and written to silver by Arrow, typed like silver (ingesting 31 dates through Spark
would take longer than the benchmarks; the gold job reads silver only, so it cannot tell the difference).

gold_lookback: in one warm process (_gold_run.py), build_gold and validate_gold of the first date (silver of
that date only) and of the 31st (its whole lookback: 30 earlier days and its own), alternated, median of
`REPEATS`. Ratio = 31st / first (goal <= 1.25: a date's cost should follow its own rows, not its history).
The 31st date is also measured against its floor: the same silver rows read, shuffled and sorted by
customer and by merchant, and the date's rows written, with no feature computed (`_gold_run._floor_build`).

gold_memory: peak RSS of the process tree (Python driver + JVM) of `mlops features --step build_gold` for the
first and the 31st date, each in a process of its own, with the daily totals of the other dates already
derived (steady state; the one-off derivation of all 31 is measured too), against the floor: a process that
starts the same SparkSession and runs a trivial job. The driver's heap is capped by MLOPS_SPARK_DRIVER_MEMORY
(2g default).

Run: `python -m benchmarks --only gold_lookback [--sizes 20000,100000]` (or gold_memory).
"""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = [20_000]  # transactions per day; 31 days of them
FIRST = date(2026, 1, 1)
DAYS = 31  # the last date's lookback (D-30 .. D) covers every date
LAST = FIRST + timedelta(days=DAYS - 1)
REPEATS = 3


def silver_history(scratch: Path, rows: int) -> Path:
    """An MLOPS_HOME whose silver holds DAYS arrival dates of `rows` transactions (made once per size)."""
    home = scratch / f"gold-{rows}"
    if (home / "lake" / "silver").is_dir():
        return home
    landing = home / "landing"
    mlops = str(Path(sys.executable).with_name("mlops"))
    subprocess.run(
        [
            *(mlops, "generate", "--start", FIRST.isoformat(), "--days", str(DAYS)),
            *("--rows-per-day", str(rows), "--landing", str(landing), "--json"),
        ],
        check=True,
        capture_output=True,
    )
    write_silver(landing, home / "lake")
    return home


def write_silver(landing: Path, lake: Path) -> None:
    """Landing CSVs -> silver tables by Arrow, typed like silver, one partition per arrival folder."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from pipelines.contracts import LABEL_COLUMNS, TRANSACTION_COLUMNS

    # Every column typed, so a header-only file (a day without chargebacks) does not make null columns.
    utc = pa.timestamp("us", tz="UTC")
    types = {
        "transactions": {
            **dict.fromkeys(TRANSACTION_COLUMNS, pa.string()),
            "amount": pa.decimal128(12, 2),
            "event_timestamp": utc,
        },
        "labels": {
            **dict.fromkeys(LABEL_COLUMNS, pa.string()),
            "is_fraud": pa.int32(),
            "label_timestamp": utc,
        },
    }
    for folder in sorted(landing.iterdir()):
        for stem, columns in types.items():
            parts = []
            for path in sorted(folder.glob(f"{stem}-*.csv")):
                table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=columns))
                table = table.append_column("source_file", pa.array([path.name] * table.num_rows))
                table = table.append_column("line_number", pa.array(range(2, table.num_rows + 2), pa.int64()))
                if stem == "transactions":
                    table = table.append_column("event_date", pc.cast(table["event_timestamp"], pa.date32()))
                parts.append(table)
            target = lake / "silver" / stem / f"arrival_date={folder.name}"
            target.mkdir(parents=True)
            pq.write_table(pa.concat_tables(parts), target / "part-00000.parquet", compression="zstd")


def _env(home: Path) -> dict[str, str]:
    return {**os.environ, "MLOPS_HOME": str(home), "MLOPS_PROFILE": "local"}


def bench_gold_lookback(sizes: list[int], scratch: Path) -> list[dict]:
    results = []
    for rows in sizes:
        home = silver_history(scratch, rows)
        run = [sys.executable, "-m", "benchmarks._gold_run", "lookback", str(home), FIRST.isoformat()]
        timings = measure([*run, LAST.isoformat(), str(REPEATS)], _env(home))["output"]
        first, last = timings[FIRST.isoformat()], timings[LAST.isoformat()]
        results.append(
            {
                "rows_per_day": rows,
                "first_rows": first["silver_rows_read"],
                "last_rows": last["silver_rows_read"],
                "first_build_seconds": first["build_gold"],
                "last_build_seconds": last["build_gold"],
                "last_floor_seconds": last["floor"],
                "last_over_floor": last["build_gold"] / last["floor"],
                "build_ratio": last["build_gold"] / first["build_gold"],
                "first_validate_seconds": first["validate_gold"],
                "last_validate_seconds": last["validate_gold"],
                "validate_ratio": last["validate_gold"] / first["validate_gold"],
                "stage_ratio": (last["build_gold"] + last["validate_gold"])
                / (first["build_gold"] + first["validate_gold"]),
            }
        )
    return results


def bench_gold_memory(sizes: list[int], scratch: Path) -> list[dict]:
    mlops = str(Path(sys.executable).with_name("mlops"))
    results = []
    for rows in sizes:
        home = silver_history(scratch, rows)
        floor = measure([sys.executable, "-m", "benchmarks._gold_run", "floor", str(home)], _env(home))
        # The first build on a lake with history derives every arrival's daily totals at once (one-off);
        # then the steady state: each date derives only its own.
        run = [sys.executable, "-m", "benchmarks._gold_run", "history", str(home), FIRST.isoformat()]
        derive = measure([*run, LAST.isoformat(), FIRST.isoformat(), LAST.isoformat()], _env(home))
        peaks = {}
        for day in (FIRST, LAST):
            build = [mlops, "features", "--date", day.isoformat(), "--step", "build_gold", "--json"]
            peaks[day] = measure(build, _env(home))
        silver = home / "lake" / "silver" / "transactions"
        results.append(
            {
                "rows_per_day": rows,
                "silver_mib": sum(p.stat().st_size for p in silver.rglob("*.parquet")) / 2**20,
                "floor_peak_mib": floor["peak_mib"],
                "history_peak_mib": derive["peak_mib"],
                "history_seconds": derive["seconds"],
                "first_peak_mib": peaks[FIRST]["peak_mib"],
                "last_peak_mib": peaks[LAST]["peak_mib"],
                "first_seconds": peaks[FIRST]["seconds"],
                "last_seconds": peaks[LAST]["seconds"],
                "last_over_floor": peaks[LAST]["peak_mib"] / floor["peak_mib"],
                "last_over_first": peaks[LAST]["peak_mib"] / peaks[FIRST]["peak_mib"],
            }
        )
    return results


def print_gold_lookback(console, results: list[dict]) -> None:
    from rich.table import Table

    table = Table(
        "rows/day",
        "silver rows read: 1st / 31st",
        "build_gold s: 1st",
        "31st",
        "31st / 1st",
        "31st's floor s",
        "31st / floor",
        "validate_gold s: 1st",
        "31st",
        "31st / 1st",
        "stage 31st / 1st",
        title="gold for the 31st date (30 days of silver history) vs the first (none), warm process, "
        f"median of {REPEATS} (goal: <= 1.25x)",
    )
    for r in results:
        table.add_row(
            f"{r['rows_per_day']:,}",
            f"{r['first_rows']:,} / {r['last_rows']:,}",
            f"{r['first_build_seconds']:.2f}",
            f"{r['last_build_seconds']:.2f}",
            f"{r['build_ratio']:.2f}x",
            f"{r['last_floor_seconds']:.2f}",
            f"{r['last_over_floor']:.2f}x",
            f"{r['first_validate_seconds']:.2f}",
            f"{r['last_validate_seconds']:.2f}",
            f"{r['validate_ratio']:.2f}x",
            f"{r['stage_ratio']:.2f}x",
        )
    console.print(table)


def print_gold_memory(console, results: list[dict]) -> None:
    from rich.table import Table

    table = Table(
        "rows/day",
        "silver MiB (31 days)",
        "floor peak MiB",
        "daily totals of 31 dates (one-off) MiB",
        "1st date peak MiB",
        "31st date peak MiB",
        "31st / floor",
        "31st / 1st",
        "1st s",
        "31st s",
        title="peak memory (process tree: Python + JVM) of `mlops features --step build_gold` vs a "
        "SparkSession running a trivial job",
    )
    for r in results:
        table.add_row(
            f"{r['rows_per_day']:,}",
            f"{r['silver_mib']:.1f}",
            f"{r['floor_peak_mib']:.0f}",
            f"{r['history_peak_mib']:.0f} ({r['history_seconds']:.0f} s)",
            f"{r['first_peak_mib']:.0f}",
            f"{r['last_peak_mib']:.0f}",
            f"{r['last_over_floor']:.2f}x",
            f"{r['last_over_first']:.2f}x",
            f"{r['first_seconds']:.1f}",
            f"{r['last_seconds']:.1f}",
        )
    console.print(table)
