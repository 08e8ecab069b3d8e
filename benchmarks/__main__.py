"""`python -m benchmarks [--sizes 1000000,10000000] [--out DIR]`: run the benchmarks, print ratio tables.

Figures are never asserted: they are measured against a baseline in the same run and reported, because
wall-clock times on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = [1_000_000, 10_000_000]  # rows per day of the generator, ingest and feature-store benchmarks


def bench_generator(sizes: list[int], scratch: Path) -> list[dict]:
    """Synthetic feed generation (streamed, with fault injection) against Arrow's CSV writer of the
    same number of rows held in memory."""
    mlops = str(Path(sys.executable).with_name("mlops"))
    results = []
    for rows in sizes:
        landing = scratch / f"gen-{rows}"
        generator = measure(
            [
                mlops,
                "generate",
                "--start",
                "2026-01-01",
                "--days",
                "1",
                "--rows-per-day",
                str(rows),
                "--landing",
                str(landing),
                "--faults",
                "duplicates=0.01,malformed=0.001",
                "--json",
            ]
        )
        written = json.loads((landing / "2026-01-01" / "_manifest.json").read_text())["transactions"]
        baseline = measure(
            [
                sys.executable,
                str(HERE / "_baselines.py"),
                "csv_floor",
                str(written["rows_written"]),
                str(scratch / f"base-{rows}"),
            ]
        )
        shutil.rmtree(landing)
        shutil.rmtree(scratch / f"base-{rows}")
        results.append(
            {
                "benchmark": "generate 1 day",
                "rows": written["rows_written"],
                "seconds": generator["seconds"],
                "rows_per_s": written["rows_written"] / generator["seconds"],
                "peak_mib": generator["peak_mib"],
                "baseline_seconds": baseline["seconds"],
                "baseline_peak_mib": baseline["peak_mib"],
                "time_ratio": generator["seconds"] / baseline["seconds"],
                "memory_ratio": generator["peak_mib"] / baseline["peak_mib"],
            }
        )
    return results


def bench_ingest(sizes: list[int], scratch: Path) -> list[dict]:
    """Landing -> bronze with Spark against a plain Spark CSV -> Parquet conversion of the same files with
    the same explicit schema in the same warm session (the baseline), with Arrow's CSV -> Parquet beside it
    as the floor; and the GX bronze suite against hand-written checks computing the same statistics in one
    Spark pass; bronze -> silver against its floor (the same rows sorted and written, nothing checked). The
    1-minute load average is recorded with each size: the figures move with it."""
    mlops = str(Path(sys.executable).with_name("mlops"))
    results = []
    for rows in sizes:
        load = os.getloadavg()[0]  # before this size's own processes add to it
        home = scratch / f"ingest-{rows}"
        landing = home / "landing"
        subprocess.run(
            [
                mlops,
                "generate",
                "--start",
                "2026-01-07",
                "--days",
                "1",
                "--rows-per-day",
                str(rows),
                "--landing",
                str(landing),
                "--faults",
                "duplicates=0.01,malformed=0.001",
                "--json",
            ],
            check=True,
            capture_output=True,
        )
        spark = measure([sys.executable, str(HERE / "_ingest_run.py"), str(home), "2026-01-07"])
        arrow = measure(
            [
                sys.executable,
                str(HERE / "_baselines.py"),
                "csv_to_parquet",
                str(landing / "2026-01-07"),
                str(scratch / f"arrow-{rows}"),
            ]
        )
        shutil.rmtree(home)
        shutil.rmtree(scratch / f"arrow-{rows}")
        run, base = spark["output"], arrow["output"]
        # [first run, second run] of each path: a fresh driver's, then a warm one's (see _ingest_run.py).
        bronze, spark_csv, gx, hand, silver, silver_floor = (
            run[f"{k}_seconds"] for k in ("bronze", "spark_csv", "gx", "hand", "silver", "silver_floor")
        )
        results.append(
            {
                "rows": run["rows_in"],
                "load_1min": load,
                "spark_bronze_seconds": bronze,
                "spark_csv_seconds": spark_csv,
                "throughput_ratio": [c / b for c, b in zip(spark_csv, bronze, strict=True)],
                "arrow_seconds": base["convert_seconds"],
                "arrow_ratio": [base["convert_seconds"] / b for b in bronze],
                "gx_seconds": gx,
                "hand_seconds": hand,
                "gx_ratio": [g / h for g, h in zip(gx, hand, strict=True)],
                "silver_seconds": silver,
                "silver_floor_seconds": silver_floor,
                "silver_over_floor": [s / f for s, f in zip(silver, silver_floor, strict=True)],
                "spark_peak_mib": spark["peak_mib"],
                "arrow_peak_mib": arrow["peak_mib"],
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument(
        "--sizes", help="sizes, comma separated (default: each benchmark's own; see its module docstring)"
    )
    parser.add_argument(
        "--only",
        choices=[
            "generator",
            "ingest",
            "feature_store",
            "training",
            "training_set",
            "dvc_versioning",
            "gold_lookback",
            "gold_memory",
            "dag_parse",
            "lineage",
            "serving",
            "spark_jobs",
            "end_to_end",
        ],
        help="run one benchmark",
    )
    parser.add_argument(
        "--history-days", type=int, help="end_to_end: days of history before the measured day (default 30)"
    )
    parser.add_argument(
        "--setup-dir",
        type=Path,
        help="end_to_end: keep the bulk history here and reuse it later (default: a temporary folder)",
    )
    parser.add_argument(
        "--baseline-commit",
        help="end_to_end, spark_jobs: also run this commit's code on the same set-up first, for before/after",
    )
    parser.add_argument("--out", type=Path, default=Path("var/bench"), help="where results.json goes")
    args = parser.parse_args()
    chosen = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    sizes = chosen or DEFAULT_SIZES
    console = Console(width=150)
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="mlops-bench-") as scratch:
        if args.only in (None, "generator"):
            results["generator"] = bench_generator(sizes, Path(scratch))
            print_generator(console, results["generator"])
        if args.only in (None, "ingest"):
            results["ingest"] = bench_ingest(sizes, Path(scratch))
            print_ingest(console, results["ingest"])
        if args.only in (None, "feature_store"):
            from benchmarks.feature_store import bench_feature_store, print_feature_store

            results["feature_store"] = bench_feature_store(sizes, Path(scratch))
            print_feature_store(console, results["feature_store"])
        if args.only in (None, "training"):
            from benchmarks.training import bench_training, print_training

            results["training"] = bench_training(Path(scratch))
            print_training(console, results["training"])
        if args.only in (None, "training_set"):
            from benchmarks.training_set import bench_training_set, print_training_set

            # 1M rows a day over a 30-day window: the goal's size (about 5 minutes of set-up, 6 GB of disk)
            results["training_set"] = bench_training_set(chosen or [1_000_000], Path(scratch))
            print_training_set(console, results["training_set"])
        if args.only in (None, "dvc_versioning"):
            from benchmarks.dvc_versioning import DEFAULT_SIZES as GOLD_ROWS
            from benchmarks.dvc_versioning import bench_dvc_versioning, print_dvc_versioning

            results["dvc_versioning"] = bench_dvc_versioning(chosen or GOLD_ROWS, Path(scratch))
            print_dvc_versioning(console, results["dvc_versioning"])
        if args.only in (None, "gold_lookback"):
            from benchmarks.gold import DEFAULT_SIZES as ROWS_PER_DAY
            from benchmarks.gold import bench_gold_lookback, print_gold_lookback

            results["gold_lookback"] = bench_gold_lookback(chosen or ROWS_PER_DAY, Path(scratch))
            print_gold_lookback(console, results["gold_lookback"])
        if args.only in (None, "gold_memory"):
            from benchmarks.gold import DEFAULT_SIZES as ROWS_PER_DAY
            from benchmarks.gold import bench_gold_memory, print_gold_memory

            results["gold_memory"] = bench_gold_memory(chosen or ROWS_PER_DAY, Path(scratch))
            print_gold_memory(console, results["gold_memory"])
        if args.only in (None, "dag_parse"):
            from benchmarks.dag_parse import bench_dag_parse, print_dag_parse

            results["dag_parse"] = bench_dag_parse([], Path(scratch))
            print_dag_parse(console, results["dag_parse"])
        if args.only in (None, "lineage"):
            from benchmarks.lineage import bench_lineage, print_lineage

            results["lineage"] = bench_lineage(Path(scratch))
            print_lineage(console, results["lineage"])
        if args.only in (None, "serving"):
            from benchmarks.serving import print_serving, run

            results["serving"] = [run(chosen[0] if chosen else 20_000, 500.0, 20.0, Path(scratch))]
            print_serving(console, results["serving"][0])
        if args.only in (None, "spark_jobs"):
            from benchmarks.spark_jobs import DEFAULT_SIZES as DEMO_ROWS
            from benchmarks.spark_jobs import bench_spark_jobs, print_spark_jobs

            results["spark_jobs"] = bench_spark_jobs(chosen or DEMO_ROWS, Path(scratch), args.baseline_commit)
            print_spark_jobs(console, results["spark_jobs"])
        if args.only == "end_to_end":  # hours at the goal's size: only when asked for (make bench-e2e)
            from benchmarks.end_to_end import DEFAULT_HISTORY_DAYS, bench_end_to_end, print_end_to_end
            from benchmarks.end_to_end import DEFAULT_SIZES as E2E_ROWS

            results["end_to_end"] = bench_end_to_end(
                chosen or E2E_ROWS,
                Path(scratch),
                args.history_days or DEFAULT_HISTORY_DAYS,
                args.setup_dir,
                args.baseline_commit,
            )
            print_end_to_end(console, results["end_to_end"])
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


def print_generator(console: Console, results: list[dict]) -> None:
    table = Table(
        "benchmark",
        "rows",
        "seconds",
        "rows/s",
        "peak MiB",
        "baseline s",
        "baseline MiB",
        "time ratio",
        "memory ratio",
        title="generator vs Arrow CSV writer (ratios: lower is better for us)",
    )
    for r in results:
        table.add_row(
            r["benchmark"],
            f"{r['rows']:,}",
            f"{r['seconds']:.1f}",
            f"{r['rows_per_s']:,.0f}",
            f"{r['peak_mib']:.0f}",
            f"{r['baseline_seconds']:.1f}",
            f"{r['baseline_peak_mib']:.0f}",
            f"{r['time_ratio']:.2f}x",
            f"{r['memory_ratio']:.2f}x",
        )
    console.print(table)
    if len(results) > 1:
        growth = results[-1]["peak_mib"] / results[0]["peak_mib"]
        console.print(
            f"generator peak memory at {results[-1]['rows']:,} rows / at {results[0]['rows']:,} rows: "
            f"{growth:.2f}x (streaming keeps it flat)"
        )


def print_ingest(console: Console, results: list[dict]) -> None:
    table = Table(
        "rows",
        "load",
        "run",
        "Spark bronze s",
        "rows/s",
        "Spark CSV->Parquet s",
        "throughput vs Spark CSV",
        "Arrow CSV->Parquet s",
        "vs Arrow (floor)",
        "GX bronze s",
        "hand checks s",
        "GX / hand",
        "silver s",
        "silver's floor s",
        "silver / floor",
        "peak MiB Spark",
        "peak MiB Arrow",
        title="ingestion (goals: throughput >= 0.5x plain Spark CSV->Parquet, GX <= 2x hand-written checks)",
    )
    for r in results:
        for index, run in enumerate(("fresh", "warm")):
            table.add_row(
                f"{r['rows']:,}",
                f"{r['load_1min']:.1f}",
                run,
                f"{r['spark_bronze_seconds'][index]:.1f}",
                f"{r['rows'] / r['spark_bronze_seconds'][index]:,.0f}",
                f"{r['spark_csv_seconds'][index]:.1f}",
                f"{r['throughput_ratio'][index]:.2f}x",
                f"{r['arrow_seconds']:.1f}",
                f"{r['arrow_ratio'][index]:.2f}x",
                f"{r['gx_seconds'][index]:.1f}",
                f"{r['hand_seconds'][index]:.1f}",
                f"{r['gx_ratio'][index]:.2f}x",
                f"{r['silver_seconds'][index]:.1f}",
                f"{r['silver_floor_seconds'][index]:.1f}",
                f"{r['silver_over_floor'][index]:.2f}x",
                f"{r['spark_peak_mib']:.0f}",
                f"{r['arrow_peak_mib']:.0f}",
            )
    console.print(table)


if __name__ == "__main__":
    main()
