"""DVC versioning of a gold date against `md5sum` of the same files.

`bench_dvc_versioning(sizes, scratch)` writes two gold dates of `rows` customer and merchant rows each (the
feature-store benchmark's generator: random feature values, which compress as badly as real ones). Then,
REPEATS times, a fresh copy of them (new inodes: nothing is known to DVC yet, as after a gold build) goes into
a fresh installation whose DVC repository is made as the first versioned date makes it, outside the timing,
and each of these runs in a process of its own (_measure.py: wall time, peak RSS of the process tree):
  - the floor: `md5sum` of a date's Parquet files, after one unmeasured pass so both read from the page cache
    (DVC's content hash is this md5; it cannot be had for less);
  - ours: `version_gold` of the two dates in one process, as the DAG's version task runs its dates
    (_version_run.py: hash both partitions, link them into the DVC cache and the local remote, record the
    revision), each call timed inside the process, wall and CPU. The first date's call also imports DVC and
    Spark's Python package (fixed costs, paid once per process); the second is what each further date costs;
    then the second date again, unchanged: DVC's state database knows the files, so this is the fixed cost.
Once per size, DVC alone: stock `dvc add` + `dvc push` of one date's files (hard links, same page cache) in a
fresh repository with DVC's default configuration (cache and remote copies), one command each.
Throughput ratio = md5sum seconds / version_gold seconds of the same date (goal >= 0.8x), median of the
repeats. The load average is recorded beside the figures: on a shared machine wall times move with it, so the
ratio of CPU seconds (md5sum's / the call's) is given too; it is what an idle machine would show, less the
call's waits (DVC's state database syncs to disk).
Run: `python -m benchmarks --only dvc_versioning [--sizes 1000000,10000000]`.
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from benchmarks._process import measure

HERE = Path(__file__).resolve().parent
DEFAULT_SIZES = [1_000_000]  # gold rows of one date (its Parquet size: docs/benchmarks.md)
REPEATS = 3


def bench_dvc_versioning(sizes: list[int], scratch: Path) -> list[dict]:
    from benchmarks.feature_store import DAY
    from core.settings import Profile, Settings
    from pipelines.versioning import ensure_repo

    dvc = str(Path(sys.executable).with_name("dvc"))
    days = [DAY.date().isoformat(), (DAY + timedelta(days=1)).date().isoformat()]
    results = []
    for rows in sizes:
        source = _two_dates(scratch / f"dvc-source-{rows}", rows, days)
        runs = []
        load = [os.getloadavg()[0]]
        for repeat in range(REPEATS):
            home = scratch / f"dvc-{rows}-{repeat}"
            home.mkdir()
            subprocess.run(["cp", "-r", str(source / "lake"), str(home / "lake")], check=True)
            ensure_repo(Settings(home=home, profile=Profile.LOCAL))
            files = {day: _files(home, day) for day in days}
            measure(
                ["sh", "-c", 'cat "$@" > /dev/null && echo "{}"', "cat", *files[days[0]], *files[days[1]]]
            )
            md5sum = {
                day: measure(["sh", "-c", 'md5sum "$@" > /dev/null && echo "{}"', "md5sum", *files[day]])
                for day in days
            }
            md5sum_cpu = _cpu_seconds(["md5sum", *files[days[1]]])
            env = {**os.environ, "MLOPS_HOME": str(home), "MLOPS_PROFILE": "local"}
            ours = measure([sys.executable, str(HERE / "_version_run.py"), *days, days[1]], env)
            first, later, again = ours["output"]["calls"]
            runs.append(
                {
                    "md5sum_seconds": md5sum[days[0]]["seconds"],
                    "first_seconds": first["seconds"],
                    "first_ratio": md5sum[days[0]]["seconds"] / first["seconds"],
                    "later_md5sum_seconds": md5sum[days[1]]["seconds"],
                    "later_seconds": later["seconds"],
                    "later_cpu_seconds": later["cpu_seconds"],
                    "later_ratio": md5sum[days[1]]["seconds"] / later["seconds"],
                    "later_md5sum_cpu_seconds": md5sum_cpu,
                    "later_cpu_ratio": md5sum_cpu / later["cpu_seconds"],
                    "import_seconds": ours["output"]["import_seconds"],
                    "process_seconds": ours["seconds"],
                    "unchanged_seconds": again["seconds"],
                    "peak_mib": ours["peak_mib"],
                    "md5sum_peak_mib": md5sum[days[0]]["peak_mib"],
                    "dataset_revs": [first["dataset_rev"], later["dataset_rev"]],
                    "copied_mib": sum(_unlinked_bytes(home / d) for d in (".dvc/cache", "dvc-remote"))
                    / 2**20,
                }
            )
            load.append(os.getloadavg()[0])
            shutil.rmtree(home)
        alone = _dvc_alone(dvc, source, scratch / f"dvc-raw-{rows}", days[0])

        def median(key: str, of: list[dict] = runs) -> float:
            return statistics.median(r[key] for r in of)

        results.append(
            {
                "gold_rows": rows,
                "files": len(_files(source, days[0])),
                "mib": sum(Path(f).stat().st_size for f in _files(source, days[0])) / 2**20,
                "repeats": REPEATS,
                **{
                    key: median(key)
                    for key in (
                        "md5sum_seconds",
                        "first_seconds",
                        "first_ratio",
                        "later_md5sum_seconds",
                        "later_seconds",
                        "later_cpu_seconds",
                        "later_ratio",
                        "later_md5sum_cpu_seconds",
                        "later_cpu_ratio",
                        "import_seconds",
                        "process_seconds",
                        "unchanged_seconds",
                    )
                },
                "later_ratio_min": min(r["later_ratio"] for r in runs),
                "later_ratio_max": max(r["later_ratio"] for r in runs),
                "dvc_alone_seconds": alone,
                "dvc_alone_ratio": median("md5sum_seconds") / alone,
                "peak_mib": max(r["peak_mib"] for r in runs),
                "md5sum_peak_mib": max(r["md5sum_peak_mib"] for r in runs),
                "copied_mib": max(r["copied_mib"] for r in runs),
                "dataset_revs": sorted({rev for r in runs for rev in r["dataset_revs"]}),
                "load_average_1min": load,
                "runs": runs,
            }
        )
        shutil.rmtree(source)
    return results


def _two_dates(source: Path, rows: int, days: list[str]) -> Path:
    """Gold of `days` (the generator writes its one date; the second is a differently seeded copy moved)."""
    from benchmarks.feature_store import write_gold_day

    write_gold_day(source / "lake", rows, seed=0)
    write_gold_day(source / "next" / "lake", rows, seed=1)
    for table in (source / "next" / "lake" / "gold").iterdir():
        (table / f"event_date={days[0]}").rename(
            source / "lake" / "gold" / table.name / f"event_date={days[1]}"
        )
    shutil.rmtree(source / "next")
    return source


def _cpu_seconds(command: list[str]) -> float:
    """CPU seconds (user + system) of one run of `command`, output discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def _files(home: Path, day: str) -> list[str]:
    return sorted(str(p) for p in (home / "lake" / "gold").glob(f"*/event_date={day}/*.parquet"))


def _unlinked_bytes(root: Path) -> int:
    """Bytes of the files under `root` that are not hard links to others (what a copy cost)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.stat().st_nlink == 1)


def _dvc_alone(dvc: str, source: Path, raw: Path, day: str) -> float:
    raw.mkdir()
    for table in (source / "lake" / "gold").iterdir():
        (raw / "gold" / table.name).mkdir(parents=True)
        subprocess.run(
            ["cp", "-al", str(table / f"event_date={day}"), str(raw / "gold" / table.name)], check=True
        )
    subprocess.run([dvc, "init", "--no-scm", "-q"], cwd=raw, check=True)
    subprocess.run([dvc, "config", "core.analytics", "false"], cwd=raw, check=True)
    subprocess.run([dvc, "remote", "add", "-q", "-d", "storage", str(raw / "remote")], cwd=raw, check=True)
    add_push = f'cd "{raw}" && "{dvc}" add -q gold && "{dvc}" push -q && echo "{{}}"'
    seconds = measure(["sh", "-c", add_push])["seconds"]
    shutil.rmtree(raw)
    return seconds


def print_dvc_versioning(console, results: list[dict]) -> None:
    from rich.table import Table

    table = Table(
        "gold rows",
        "MiB",
        "md5sum s",
        "1st date s",
        "1st / md5sum",
        "next date s",
        "next / md5sum",
        "min..max",
        "cpu: next / md5sum",
        "unchanged s",
        "dvc add+push / md5sum",
        "MiB copied",
        "load avg",
        title="DVC versioning of a gold date (hash, cache, remote, revision) vs md5sum of the same files, "
        "median of repeats (goal: throughput >= 0.8x md5sum)",
    )
    for r in results:
        table.add_row(
            f"{r['gold_rows']:,}",
            f"{r['mib']:.0f}",
            f"{r['md5sum_seconds']:.2f}",
            f"{r['first_seconds']:.2f}",
            f"{r['first_ratio']:.2f}x",
            f"{r['later_seconds']:.2f}",
            f"{r['later_ratio']:.2f}x",
            f"{r['later_ratio_min']:.2f}..{r['later_ratio_max']:.2f}",
            f"{r['later_cpu_ratio']:.2f}x",
            f"{r['unchanged_seconds']:.2f}",
            f"{r['dvc_alone_ratio']:.2f}x",
            f"{r['copied_mib']:.0f}",
            "..".join(f"{x:.1f}" for x in (min(r["load_average_1min"]), max(r["load_average_1min"]))),
        )
    console.print(table)
