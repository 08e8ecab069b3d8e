"""What lineage costs a task process: a step's START and COMPLETE events as core/lineage.py sends them (dicts
written to files) against the same events built with the OpenLineage client's classes and written by its
file transport (the baseline), each in a fresh interpreter holding what an ingest task holds. The first
pair includes every import the way needs (what each task process pays once, on the arrival's critical path);
the next pairs are the steady cost. Median of REPEATS, interleaved.

Run: `python -m benchmarks --only lineage`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
REPEATS = 5
WAYS = ("ours", "client")


def bench_lineage(scratch: Path) -> list[dict]:
    samples: dict[str, list[dict]] = {way: [] for way in WAYS}
    for k in range(REPEATS):
        for way in WAYS:
            done = subprocess.run(
                [sys.executable, "-m", "benchmarks._lineage_run", way, str(scratch / f"lineage-{way}-{k}")],
                capture_output=True,
                text=True,
                cwd=HERE.parent,
                check=True,
            )
            samples[way].append(json.loads(done.stdout.strip().splitlines()[-1]))
    first = {w: statistics.median(s["first_s"] for s in samples[w]) for w in WAYS}
    steady = {w: statistics.median(s["next_s"] for s in samples[w]) for w in WAYS}
    return [
        {
            "benchmark": "a step's START + COMPLETE events",
            "first_ms": first["ours"] * 1000,
            "next_ms": steady["ours"] * 1000,
            "client_first_ms": first["client"] * 1000,
            "client_next_ms": steady["client"] * 1000,
            "first_ratio": first["ours"] / first["client"],
            "next_ratio": steady["ours"] / steady["client"],
        }
    ]


def print_lineage(console: Console, results: list[dict]) -> None:
    table = Table(
        "benchmark",
        "first pair ms",
        "next pairs ms",
        "client first ms",
        "client next ms",
        "first ratio",
        "next ratio",
        title="lineage events in a task process vs the OpenLineage client (ratios: lower is better)",
    )
    for r in results:
        table.add_row(
            r["benchmark"],
            f"{r['first_ms']:.1f}",
            f"{r['next_ms']:.2f}",
            f"{r['client_first_ms']:.1f}",
            f"{r['client_next_ms']:.2f}",
            f"{r['first_ratio']:.2f}x",
            f"{r['next_ratio']:.2f}x",
        )
    console.print(table)
